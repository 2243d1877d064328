"""A lower bound from whole groups: column generation over the groups of each micro-batch length class.

The length-class LP of :mod:`solver_models.length_class_bound` lets a group of size d hold any
fraction of a sample, so a group whose long sample fills 60% of its time may fill the rest with 40% of
another long one. Here a group is a column: a size d and a set of at least one sample that fit it
together, in memory and in time. The LP over all such columns keeps every row of the class LP (so it
is at least the class LP on the same classes) and it is a lower bound for every plan the verifier
accepts. Its columns are generated: a restricted master LP over the columns found so far, and per class
and size a pricing problem that finds the column of least reduced cost (a knapsack in two dimensions,
solved by dynamic programming).

Notation as in :mod:`solver_models.length_class_bound`: N ranks, C the largest per-rank capacity, b the
group constant, delta_d = b_d - b, t_i(d) the best time of sample i on size d, L_i its tokens, classes
(l_g, u_g] of micro-batch lengths tau, M and K the fewest and most micro-batches.

**Columns.** A column c of class g is a size d_c and a set I_c of samples allowed on d_c with

    sum_{i in I_c} L_i <= C d_c                     (memory: the group holds its samples' tokens)
    w_c = delta_d + sum_{i in I_c} t_i(d_c) <= u_g  (time: the group finishes within the class's length)

Every group of a micro-batch of class g of a plan is such a column.

**Master.** y_c >= 0 the number of groups c over the class's micro-batches; x_g, S_g, W_gd as in the
class LP; N_gd = sum_{c of size d} d y_c; h_c the samples of c over half its memory.

    minimise   sum_g (b x_g + S_g)
    subject to sum_{c: i in I_c} y_c >= 1                   (1) every sample in some group
               M <= sum_g x_g <= K                          (2) the micro-batch count
               l_g x_g <= S_g <= u_g x_g                    (3) lengths within the class
               sum_c d_c y_c <= N x_g                       (4) a micro-batch's groups hold at most N ranks
               sum_{c of size d} d w_c y_c <= W_gd          (5) each group lasts at most its micro-batch
               W_gd <= u_g N_gd,  W_gd <= l_g N_gd + N (S_g - l_g x_g),  sum_d W_gd <= N S_g   (6)
               sum_{c of class g: i in I_c} y_c <= x_g      (7) a sample at most once per micro-batch
               sum_{c of size d} (L(I_c) / C - d) y_c <= 0  (8) memory, as the class LP counts it
               sum_{c of size d} d (h_c - 1) y_c <= 0       (9) two samples of over half never share

Rows (5) and (6) hold for a plan by the class LP's argument, with (5) because a group of micro-batch
m lasts w_c <= tau_m; (8) and (9) hold column by column for real groups and keep the relaxed columns
below in check. So the master's optimum over all columns is at most the step time of every plan (the
per-step constant aside) whose micro-batches are at most u_G long.

**Pricing.** With the master's duals (pi_i >= 0 of (1); rho_g, sigma_gd, alpha_gd, beta_gd, gamma_gi,
mu_gd, eta_gd <= 0 of (4), (5), the first two of (6), (7), (8) and (9)), a column of class g and size d
has reduced cost

    K_gd - sum_{i in I} p_i,   p_i = pi_i + gamma_gi + d sigma_gd t_i(d) + mu_gd L_i / C + eta_gd d [i heavy],
    K_gd = -d rho_g - d delta_d sigma_gd + d u_g alpha_gd + d l_g beta_gd + d mu_gd + d eta_gd,

so the least is K_gd less a knapsack's best profit under the time and memory rows above (K_gd can be
negative: a column's ranks loosen (6), (8) and (9); then the best single sample is a column too, even
at a loss). The knapsack is solved by dynamic programming on a grid: each time and each token count is
rounded down to a multiple of 1/``TIME_CELLS`` of the time room and 1/``MEMORY_CELLS`` of the memory, so
every set that fits fits the grid too and the grid's best profit is at least the true one. A set the
grid keeps may overrun the true rows by a few cells; it enters the master with its true coefficients
(a relaxation: more columns never raise the LP, so the bound stays a bound).

**The bound.** Each iteration adds the negative columns and solves the master again. When no class
and size has a negative column the master is optimal over every column the grid admits and its value
is a bound. Stopped at the deadline, the value plus N K times the least reduced cost per rank (a plan's
groups use at most N K rank-micro-batches) is one (the Lagrangian bound). Every plan has a whole number
of micro-batches and the LP's value is convex in the count, so when the LP's count is not whole the
count is fixed to the whole numbers on either side and the lesser of their two LPs is a bound too.
Rounds after the first split the classes the LP used, as the class LP does; the first round's classes
(``FIRST_CLASSES`` in log, finer near a plan's micro-batch lengths) are usually where it pays.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from optimizer.costs.tables import CostTables
from solver_models.length_class_bound import SAFETY, _Data, _refined, first_classes
from solver_models.size_bound import HALF, _highs

TIME_CELLS = 160
"""Cells of a group's time room in the pricing grid."""

MEMORY_CELLS = 32
"""Cells of a group's memory in the pricing grid."""

SLACK = 100.0
"""A sample left out of every column costs this many incumbents: the master is feasible from its first
columns on whatever the count, and never leaves a sample out where a column could hold it."""

TOLERANCE = 1e-6
"""A column enters when its reduced cost is below minus this share of the master's value."""


@dataclass(frozen=True)
class ColumnBound:
    """The bound in seconds (micro-batches only; at most the incumbent), whether column generation
    converged on every count it tried, its rounds and columns, the LP's micro-batch count, and seconds."""

    bound_s: float
    converged: bool
    rounds: int
    columns: int
    count: float
    seconds: float


@dataclass
class _Column:
    cls: int
    size: int  # index into the degrees
    samples: np.ndarray
    work: float  # w_c


@dataclass
class _Master:
    """The restricted master: its HiGHS model and where its rows sit."""

    lp: Any
    optimal: Any  # HiGHS's optimal model status
    n: int
    classes: int
    k: int
    cover: int  # first row of (1)
    count: int  # row (2)
    rank: int  # first row of (4), one per class
    work: int  # first row of (5), k per class
    w_high: int  # first row of W <= u N, k per class
    w_low: int  # first row of W <= l N + N (S - l x), k per class
    once: int  # first row of (7), n per class
    memory: int  # first row of (8), k per class
    heavy: int  # first row of (9), k per class
    columns: list[_Column] = field(default_factory=list)
    seen: set[tuple[int, int, bytes]] = field(default_factory=set)


def _build(
    highspy: Any, d: _Data, lows: list[float], highs: list[float], m_low: int, m_high: int, big: float
) -> _Master:
    inf = highspy.kHighsInf
    n, k, g_count, N = d.n, d.k, len(highs), float(d.n_ranks)
    lp = highspy.Highs()
    lp.setOptionValue("output_flag", False)
    lp.setOptionValue("threads", 1)
    # The dual simplex: the primal one, natural after added columns, stalled for minutes on the slack's
    # large cost (one fixture seeded with its optimum's groups: 186 s against 0.45 s).
    lp.setOptionValue("simplex_strategy", 1)
    # columns: per class x, S, W_0..W_{k-1}; then one slack per sample
    per = 2 + k
    cost = np.zeros(g_count * per + n)
    for g in range(g_count):
        cost[g * per] = d.b
        cost[g * per + 1] = 1.0
    cost[g_count * per :] = big
    lp.addCols(
        cost.shape[0],
        cost,
        np.zeros(cost.shape[0]),
        np.full(cost.shape[0], inf),
        0,
        np.zeros(0, np.int32),
        np.zeros(0, np.int32),
        np.zeros(0),
    )
    lower: list[float] = []
    upper: list[float] = []
    entries: list[list[tuple[int, float]]] = []

    def row(lo: float, hi: float, items: list[tuple[int, float]]) -> int:
        lower.append(lo)
        upper.append(hi)
        entries.append(items)
        return len(lower) - 1

    slack = g_count * per
    cover = len(lower)
    for i in range(n):
        row(1.0, inf, [(slack + i, 1.0)])
    count = row(float(m_low), float(m_high), [(g * per, 1.0) for g in range(g_count)])
    for g in range(g_count):  # (3)
        x, s = g * per, g * per + 1
        row(0.0, inf, [(s, 1.0), (x, -lows[g])])
        row(-inf, 0.0, [(s, 1.0), (x, -highs[g])])
    rank = len(lower)
    for g in range(g_count):  # (4)
        row(-inf, 0.0, [(g * per, -N)])
    work = len(lower)
    for g in range(g_count):  # (5)
        for j in range(k):
            row(-inf, 0.0, [(g * per + 2 + j, -1.0)])
    w_high = len(lower)
    for g in range(g_count):
        for j in range(k):
            row(-inf, 0.0, [(g * per + 2 + j, 1.0)])
    w_low = len(lower)
    for g in range(g_count):
        x, s = g * per, g * per + 1
        for j in range(k):
            row(-inf, 0.0, [(g * per + 2 + j, 1.0), (s, -N), (x, N * lows[g])])
    for g in range(g_count):
        row(-inf, 0.0, [*((g * per + 2 + j, 1.0) for j in range(k)), (g * per + 1, -N)])
    once = len(lower)
    for g in range(g_count):  # (7)
        for _i in range(n):
            row(-inf, 0.0, [(g * per, -1.0)])
    memory = len(lower)
    for _g in range(g_count):  # (8): the column's tokens over C, less d
        for _j in range(k):
            row(-inf, 0.0, [])
    heavy = len(lower)
    for _g in range(g_count):  # (9): d times the column's samples of over half its memory, less d
        for _j in range(k):
            row(-inf, 0.0, [])
    starts = np.cumsum([0] + [len(e) for e in entries[:-1]]).astype(np.int32)
    index = np.array([c for e in entries for c, _ in e], dtype=np.int32)
    value = np.array([v for e in entries for _, v in e], dtype=np.float64)
    lp.addRows(len(lower), np.array(lower), np.array(upper), index.shape[0], starts, index, value)
    return _Master(
        lp,
        highspy.HighsModelStatus.kOptimal,
        n,
        g_count,
        k,
        cover,
        count,
        rank,
        work,
        w_high,
        w_low,
        once,
        memory,
        heavy,
    )


def _add(master: _Master, d: _Data, lows: list[float], highs: list[float], cols: list[_Column]) -> None:
    if not cols:
        return
    k = master.k
    starts, index, value = [], [], []
    at = 0
    for c in cols:
        deg = float(d.deg[c.size])
        g, j = c.cls, c.size
        rows = [master.cover + int(i) for i in c.samples] + [master.once + g * master.n + int(i) for i in c.samples]
        vals = [1.0] * len(rows)
        tokens = float(d.lengths[c.samples].sum())
        heavy = int((d.lengths[c.samples] > HALF * d.cap * deg).sum())
        rows += [master.rank + g, master.work + g * k + j, master.w_high + g * k + j, master.w_low + g * k + j]
        vals += [deg, deg * c.work, -highs[g] * deg, -lows[g] * deg]
        rows += [master.memory + g * k + j, master.heavy + g * k + j]
        vals += [tokens / d.cap - deg, deg * (heavy - 1)]
        master.seen.add((g, j, c.samples.tobytes()))
        starts.append(at)
        index += rows
        value += vals
        at += len(rows)
    master.lp.addCols(
        len(cols),
        np.zeros(len(cols)),
        np.zeros(len(cols)),
        np.full(len(cols), math.inf),
        len(index),
        np.array(starts, dtype=np.int32),
        np.array(index, dtype=np.int32),
        np.array(value, dtype=np.float64),
    )
    master.columns += cols


def _knapsack(
    profit: np.ndarray, time_w: np.ndarray, mem_w: np.ndarray, time_room: float, mem_room: float
) -> tuple[float, np.ndarray]:
    """The best profit of a set within both rooms on the rounded-down grid (at least the true best),
    and the set (indices into the arrays)."""
    R, Q = TIME_CELLS, MEMORY_CELLS
    a = np.floor(time_w / time_room * R * (1 - 1e-12)).astype(np.int64)
    m = np.floor(mem_w / mem_room * Q * (1 - 1e-12)).astype(np.int64)
    a = np.minimum(a, R)
    m = np.minimum(m, Q)
    value = np.zeros((R + 1, Q + 1))
    taken = np.zeros((profit.shape[0], R + 1, Q + 1), dtype=bool)
    for item in range(profit.shape[0]):
        ai, mi, p = int(a[item]), int(m[item]), float(profit[item])
        shifted = value[: R + 1 - ai, : Q + 1 - mi] + p
        target = value[ai:, mi:]
        better = shifted > target
        if better.any():
            taken[item, ai:, mi:] = better
            value[ai:, mi:] = np.where(better, shifted, target)
    r, q = R, Q
    chosen = []
    for item in range(profit.shape[0] - 1, -1, -1):
        if taken[item, r, q]:
            chosen.append(item)
            r -= int(a[item])
            q -= int(m[item])
    return float(value[R, Q]), np.array(chosen[::-1], dtype=np.int64)


def _fractional(profit: np.ndarray, weight: np.ndarray, room: float) -> float:
    """The fractional knapsack's best profit: at least the 0/1 best under this one row."""
    ratio = profit / np.maximum(weight, 1e-300)
    order = np.argsort(-ratio)
    filled = np.cumsum(weight[order])
    whole = int(np.searchsorted(filled, room, side="right"))
    total = float(profit[order[:whole]].sum())
    if whole < order.shape[0]:
        left = room - (float(filled[whole - 1]) if whole else 0.0)
        total += float(profit[order[whole]]) * max(0.0, left) / max(float(weight[order[whole]]), 1e-300)
    return total


class _Pricing:
    """Per class and size: which samples may join a group of that size in that class, and their times."""

    def __init__(self, tables: CostTables, d: _Data, highs: list[float]) -> None:
        t = tables.for_bounds.best_time
        allowed = np.arange(d.k)[None, :] >= tables.for_bounds.min_degree_index[:, None]
        self.d = d
        self.highs = highs
        self.time = t
        self.heavy = d.lengths[:, None] > HALF * d.cap * d.deg[None, :]
        self.room: list[list[tuple[float, np.ndarray] | None]] = []
        for u in highs:
            per_size: list[tuple[float, np.ndarray] | None] = []
            for j in range(d.k):
                room = u - float(d.delta[j])
                fits = allowed[:, j] & (t[:, j] <= room) & (d.lengths <= d.cap * d.deg[j])
                per_size.append((room, np.flatnonzero(fits)) if room > 0 and fits.any() else None)
            self.room.append(per_size)

    def price(
        self,
        g: int,
        j: int,
        pi: np.ndarray,
        rho: float,
        sigma: float,
        alpha: float,
        beta: float,
        mu: float,
        eta: float,
        low: float,
    ) -> tuple[float, _Column | None]:
        """The least reduced cost of a column of class g and size j (at most the true least), and the column."""
        entry = self.room[g][j]
        if entry is None:
            return 0.0, None
        d = self.d
        deg = float(d.deg[j])
        const = (
            -deg * rho
            - deg * float(d.delta[j]) * sigma
            + deg * self.highs[g] * alpha
            + deg * low * beta
            + mu * deg
            + eta * deg
        )
        room, items = entry
        times = self.time[items, j]
        profit = pi[items] + deg * sigma * times + mu * d.lengths[items] / d.cap + eta * deg * self.heavy[items, j]
        keep = profit > 0
        if not keep.any():
            # A column holds at least one sample: with no profitable one, the best is the least unprofitable
            # alone (its ranks still loosen the class's rows when const is negative).
            one = int(np.argmax(profit))
            column = _Column(g, j, items[one : one + 1], float(d.delta[j]) + float(times[one]))
            return const - float(profit[one]), column
        items, times, profit = items[keep], times[keep], profit[keep]
        tokens = d.lengths[items]
        mem_room = d.cap * deg
        bound = min(_fractional(profit, times, room), _fractional(profit, tokens, mem_room))
        if const - bound >= 0:
            return const - bound, None
        best, chosen = _knapsack(profit, times, tokens, room, mem_room)
        samples = items[chosen]
        column = _Column(g, j, samples, float(d.delta[j]) + float(times[chosen].sum()))
        return const - best, column


def column_bound(
    tables: CostTables,
    upper_s: float,
    rounds: int = 1,
    hints: tuple[float, ...] = (),
    groups: Sequence[tuple[int, Sequence[int]]] = (),
    deadline: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> ColumnBound | None:
    """The bound of the module docstring below an incumbent of ``upper_s`` seconds (a verified plan's step
    time less the per-step constant), at most ``upper_s``; None when HiGHS is missing or the incumbent
    leaves no room. ``hints``: micro-batch lengths tau of a good plan, near which the first classes are
    finer; ``groups``: (size, sample indices) of a good plan's groups, the first columns beside each sample
    alone. Each of ``rounds`` splits the classes the last one used in ``SPLIT``; past ``deadline`` (an
    instant of ``clock``) the round in hand stops with its Lagrangian bound."""
    highspy = _highs()
    if highspy is None or not math.isfinite(upper_s):
        return None
    started = clock()
    setup = first_classes(tables, upper_s, hints)
    if setup is None:
        return None
    d, m_low, m_high, highs = setup
    pool = _seeds(tables, d, groups)
    best: ColumnBound | None = None
    done = 0
    all_converged = True
    for done in range(1, rounds + 1):
        if deadline is not None and clock() >= deadline:
            break
        lows = _lows(highs)
        found = _round(highspy, tables, d, lows, highs, m_low, m_high, upper_s, pool, deadline, clock)
        if found is None:
            break
        value, converged, count, used, pool = found
        all_converged = all_converged and converged
        if best is None or value > best.bound_s:
            best = ColumnBound(
                bound_s=min(value * (1 - SAFETY), upper_s),
                converged=converged,
                rounds=done,
                columns=len(pool),
                count=count,
                seconds=clock() - started,
            )
        if value >= upper_s or not converged:
            break
        highs = sorted(_refined(highs, used))
    if best is None:
        return None
    return ColumnBound(
        bound_s=best.bound_s,
        converged=all_converged,
        rounds=done,
        columns=best.columns,
        count=best.count,
        seconds=clock() - started,
    )


def _lows(highs: list[float]) -> list[float]:
    """Each class's short end l_g: the end of the class below it (0 for the first)."""
    return [0.0, *highs[:-1]]


def _seeds(tables: CostTables, d: _Data, groups: Sequence[tuple[int, Sequence[int]]]) -> list[_Column]:
    """The first columns: every sample alone on its quickest size, and the given groups that fit."""
    out = []
    for i in range(d.n):
        mine = d.pair_sample == i
        best = int(np.argmin(np.where(mine, d.pair_length, np.inf)))
        out.append(_Column(-1, int(d.pair_size[best]), np.array([i]), float(d.pair_length[best])))
    t = tables.for_bounds.best_time
    lowest = tables.for_bounds.min_degree_index
    for size, members in groups:
        j = int(np.searchsorted(d.deg, size))
        samples = np.asarray(sorted(members), dtype=np.int64)
        if j >= d.k or d.deg[j] != size or samples.size == 0 or (lowest[samples] > j).any():
            continue
        if float(d.lengths[samples].sum()) > d.cap * size:
            continue
        out.append(_Column(-1, j, samples, float(d.delta[j]) + float(t[samples, j].sum())))
    return out


def _round(
    highspy: Any,
    tables: CostTables,
    d: _Data,
    lows: list[float],
    highs: list[float],
    m_low: int,
    m_high: int,
    upper_s: float,
    pool: list[_Column],
    deadline: float | None,
    clock: Callable[[], float],
) -> tuple[float, bool, float, set[int], list[_Column]] | None:
    """Column generation on one set of classes, the count left free and then fixed on either side of the
    LP's: the bound, whether every generation converged, the LP's count, the classes it used, and the
    columns (class-free, for the next round)."""
    master = _build(highspy, d, lows, highs, m_low, m_high, big=SLACK * upper_s)
    pricing = _Pricing(tables, d, highs)
    placed = []
    for c in pool:
        g = int(np.searchsorted(highs, c.work * (1 - 1e-12)))
        if g < len(highs):
            placed.append(_Column(g, c.size, c.samples, c.work))
    _add(master, d, lows, highs, placed)
    generated = _generate(master, pricing, d, lows, highs, m_high, deadline, clock)
    if generated is None:
        return None
    value, converged, count, used = generated
    if converged and abs(count - round(count)) > 1e-6:
        # The LP's value is convex in the count: the whole counts on either side bound every plan's.
        sides: list[float] = []
        for whole in (math.floor(count), math.ceil(count)):
            if not m_low <= whole <= m_high:
                continue
            master.lp.changeRowBounds(master.count, float(whole), float(whole))
            side = _generate(master, pricing, d, lows, highs, m_high, deadline, clock)
            if side is None:
                sides.clear()
                break
            sides.append(side[0])
            converged = converged and side[1]
        if sides:
            value = max(value, min(sides))
    return value, converged, count, used, [_Column(-1, c.size, c.samples, c.work) for c in master.columns]


def _generate(
    master: _Master,
    pricing: _Pricing,
    d: _Data,
    lows: list[float],
    highs: list[float],
    m_high: int,
    deadline: float | None,
    clock: Callable[[], float],
) -> tuple[float, bool, float, set[int]] | None:
    """Column generation on the master as it stands: its bound (the Lagrangian one when stopped at
    ``deadline``), whether it converged, the micro-batch count and the classes of the last LP; None when
    HiGHS fails on the first LP."""
    lp = master.lp
    k = master.k
    best_bound = -math.inf
    while True:
        lp.run()
        if lp.getModelStatus() != master.optimal:
            lp.clearSolver()  # a warm start the simplex could not finish: solve afresh
            lp.run()
        if lp.getModelStatus() != master.optimal:
            return None if best_bound == -math.inf else (best_bound, False, math.nan, set())
        value = float(lp.getInfo().objective_function_value)
        sol = lp.getSolution()
        duals = np.asarray(sol.row_dual)
        primal = np.asarray(sol.col_value)
        counts = primal[np.arange(master.classes) * (2 + k)]
        count = float(counts.sum())
        used = {int(g) for g in np.flatnonzero(counts > 1e-9)}
        pi = duals[master.cover : master.cover + master.n]
        once = duals[master.once : master.once + master.n * master.classes].reshape(master.classes, -1)
        least_per_rank = 0.0
        new: list[_Column] = []
        for g in range(master.classes):
            rho = float(duals[master.rank + g])
            for j in range(k):
                at = g * k + j
                reduced, column = pricing.price(
                    g,
                    j,
                    pi + once[g],
                    rho,
                    float(duals[master.work + at]),
                    float(duals[master.w_high + at]),
                    float(duals[master.w_low + at]),
                    float(duals[master.memory + at]),
                    float(duals[master.heavy + at]),
                    lows[g],
                )
                least_per_rank = min(least_per_rank, reduced / float(d.deg[j]))
                if column is not None and reduced < -TOLERANCE * max(value, 1e-9):
                    key = (g, j, column.samples.tobytes())
                    if key not in master.seen:  # one already in the master is within the LP's tolerance
                        master.seen.add(key)
                        new.append(column)
        # The Lagrangian bound: what the LP's duals prove whatever columns are still missing.
        lagrange = value + d.n_ranks * m_high * least_per_rank
        best_bound = max(best_bound, lagrange)
        if not new:
            return best_bound, True, count, used
        if deadline is not None and clock() >= deadline:
            return best_bound, False, count, used
        _add(master, d, lows, highs, new)
