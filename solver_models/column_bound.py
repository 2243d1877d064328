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

**The bound.** Each iteration adds the negative columns and solves the master again; pricing returns,
besides each class and size's best column, up to ``DISJOINT`` more on the samples the ones before left
out. The rows (7), n per class, are added only when the master's solution breaks one (most never bind).
When no class and size has a negative column the master is optimal over every column the grid admits
and its value is a bound. At any duals of the right signs the Lagrangian function is a bound too: the
rows priced at their duals, plus the least that the master's other variables and every column can
cost at those duals, given what every plan faster than the incumbent satisfies (see ``_lagrange``).
Generation stops when the best of these is within ``CLOSE`` of the master's value, and answers it when
the deadline stops generation first. Every plan has a whole number of micro-batches and the LP's value
is convex in the count, so when the LP's count is not whole the count is fixed to the whole numbers on
either side and the lesser of their two LPs is a bound too.
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

from optimizer import jit
from optimizer.costs.tables import CostTables
from solver_models import knapsack_kernels
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

SIMPLEX = 1
"""HiGHS's simplex strategy for the master's LPs after the first: the dual simplex (1). The first LP is
solved by the primal simplex, on which the dual one stalled for minutes when seeded with a plan's groups
(video-analytical-16x32-s0 of tests/fixtures/optima.json)."""

DISJOINT = 8
"""Per class and size, pricing returns up to this many more columns, each on samples the ones before left out."""

CLOSE = 1e-4
"""Generation stops when the best Lagrangian bound is within this share of the master's value."""


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
    length: float = 0.0  # the least micro-batch length tau of its class (a plan's group: its micro-batch's)


@dataclass
class _Master:
    """The restricted master: its HiGHS model and where its rows sit."""

    lp: Any
    optimal: Any  # HiGHS's optimal model status
    timed_out: Any  # and its time-limit one
    n: int
    classes: int
    k: int
    cover: int  # first row of (1)
    count: int  # row (2)
    rank: int  # first row of (4), one per class
    work: int  # first row of (5), k per class
    w_high: int  # first row of W <= u N, k per class
    w_low: int  # first row of W <= l N + N (S - l x), k per class
    memory: int  # first row of (8), k per class
    heavy: int  # first row of (9), k per class
    row_low: np.ndarray  # every row's bounds, for the Lagrangian bound at any duals
    row_high: np.ndarray
    cost: np.ndarray  # the costs of the columns that are not groups: x, S, W per class, then the slacks
    entries: tuple[np.ndarray, np.ndarray, np.ndarray]  # (row, column, value) of those columns
    columns: list[_Column] = field(default_factory=list)
    seen: set[tuple[int, int, bytes]] = field(default_factory=set)
    once: dict[int, int] = field(default_factory=dict)  # the rows (7) so far, by class * n + sample
    memberships: list[np.ndarray] = field(default_factory=list)  # per column, class * n + each sample
    upper: float = math.inf  # the incumbent U: plans that matter have sum_g (b x_g + S_g) <= U


def _build(
    highspy: Any, d: _Data, lows: list[float], highs: list[float], m_low: int, m_high: int, big: float
) -> _Master:
    inf = highspy.kHighsInf
    n, k, g_count, N = d.n, d.k, len(highs), float(d.n_ranks)
    lp = highspy.Highs()
    lp.setOptionValue("output_flag", False)
    lp.setOptionValue("threads", 1)
    lp.setOptionValue("simplex_strategy", 4)  # the first LP: the primal simplex (see SIMPLEX)
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
    rows = np.repeat(np.arange(len(entries)), [len(e) for e in entries])
    return _Master(
        lp,
        highspy.HighsModelStatus.kOptimal,
        highspy.HighsModelStatus.kTimeLimit,
        n,
        g_count,
        k,
        cover,
        count,
        rank,
        work,
        w_high,
        w_low,
        memory,
        heavy,
        np.array(lower),
        np.array(upper),
        cost,
        (rows, index, value),
    )


def _coefficients(
    master: _Master, d: _Data, lows: list[float], highs: list[float], c: _Column
) -> tuple[list[int], list[float]]:
    """The master's rows a column enters and its coefficients there."""
    k, g, j = master.k, c.cls, c.size
    deg = float(d.deg[j])
    rows = [master.cover + int(i) for i in c.samples]
    rows += [master.once[key] for key in (g * master.n + c.samples).tolist() if key in master.once]
    vals = [1.0] * len(rows)
    tokens = float(d.lengths[c.samples].sum())
    heavy = int((d.lengths[c.samples] > HALF * d.cap * deg).sum())
    rows += [master.rank + g, master.work + g * k + j, master.w_high + g * k + j, master.w_low + g * k + j]
    vals += [deg, deg * c.work, -highs[g] * deg, -lows[g] * deg]
    rows += [master.memory + g * k + j, master.heavy + g * k + j]
    vals += [tokens / d.cap - deg, deg * (heavy - 1)]
    return rows, vals


def _add(master: _Master, d: _Data, lows: list[float], highs: list[float], cols: list[_Column]) -> None:
    if not cols:
        return
    starts, index, value = [], [], []
    at = 0
    for c in cols:
        rows, vals = _coefficients(master, d, lows, highs, c)
        master.seen.add((c.cls, c.size, c.samples.tobytes()))
        master.memberships.append(c.cls * master.n + c.samples)
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


def _add_once_rows(master: _Master, primal: np.ndarray) -> int:
    """Add the rows (7) the LP's solution breaks (a sample in more than x_g groups of class g): the master
    starts without them, as most never bind and they would be n per class. Returns how many were added."""
    if not master.columns:
        return 0
    fixed = master.cost.shape[0]
    per = 2 + master.k
    sizes = np.array([m.shape[0] for m in master.memberships])
    keys = np.concatenate(master.memberships)
    owner = np.repeat(np.arange(len(master.memberships)), sizes)
    load = np.bincount(keys, weights=primal[fixed + owner], minlength=master.classes * master.n)
    counts = primal[np.arange(master.classes) * per]
    broken = np.flatnonzero(load > np.repeat(counts, master.n) + 1e-7)
    broken = np.array([key for key in broken.tolist() if key not in master.once], dtype=np.int64)
    if broken.size == 0:
        return 0
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    starts: list[int] = []
    index: list[int] = []
    value: list[float] = []
    first = master.lp.getNumRow()
    for at, key in enumerate(broken.tolist()):
        lo, hi = np.searchsorted(sorted_keys, [key, key + 1])
        cols = (fixed + owner[order[lo:hi]]).tolist() + [(key // master.n) * per]
        starts.append(len(index))
        index += cols
        value += [1.0] * (len(cols) - 1) + [-1.0]
        master.once[key] = first + at
    master.lp.addRows(
        broken.size,
        np.full(broken.size, -math.inf),
        np.zeros(broken.size),
        len(index),
        np.array(starts, dtype=np.int32),
        np.array(index, dtype=np.int32),
        np.array(value, dtype=np.float64),
    )
    rows, cols, vals = master.entries
    counted = np.array([(key // master.n) * per for key in broken.tolist()], dtype=np.int64)
    master.entries = (
        np.concatenate([rows, first + np.arange(broken.size)]),
        np.concatenate([cols, counted]),
        np.concatenate([vals, np.full(broken.size, -1.0)]),
    )
    master.row_low = np.concatenate([master.row_low, np.full(broken.size, -math.inf)])
    master.row_high = np.concatenate([master.row_high, np.zeros(broken.size)])
    return int(broken.size)


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
    taken = np.zeros((profit.shape[0], R + 1, Q + 1), dtype=np.bool_)
    knapsack_kernels.fill(profit.astype(np.float64), a, m, value, taken)
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
    ) -> tuple[float, list[_Column]]:
        """The least reduced cost of a column of class g and size j (at most the true least); the column, if
        its reduced cost is negative, and up to ``DISJOINT`` more of negative reduced cost on other samples."""
        entry = self.room[g][j]
        if entry is None:
            return 0.0, []
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
            return const - float(profit[one]), [column]
        items, times, profit = items[keep], times[keep], profit[keep]
        tokens = d.lengths[items]
        mem_room = d.cap * deg
        bound = min(_fractional(profit, times, room), _fractional(profit, tokens, mem_room))
        if const - bound >= 0:
            return const - bound, []
        best, chosen = _knapsack(profit, times, tokens, room, mem_room)
        columns = [_Column(g, j, items[chosen], float(d.delta[j]) + float(times[chosen].sum()))]
        least = const - best
        left = np.ones(items.shape[0], dtype=bool)
        for _ in range(DISJOINT):
            # more columns from the samples the ones so far left out: the master needs many per class and
            # size, and one knapsack costs far less than one more master LP
            left[chosen] = False
            rest = np.flatnonzero(left)
            if rest.size == 0:
                break
            more, picked = _knapsack(profit[rest], times[rest], tokens[rest], room, mem_room)
            if const - more >= 0 or picked.size == 0:
                break
            chosen = rest[picked]
            columns.append(_Column(g, j, items[chosen], float(d.delta[j]) + float(times[chosen].sum())))
        return least, columns


def column_bound(
    tables: CostTables,
    upper_s: float,
    rounds: int = 1,
    hints: tuple[float, ...] = (),
    micro_batches: Sequence[Sequence[tuple[int, Sequence[int]]]] = (),
    deadline: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> ColumnBound | None:
    """The bound of the module docstring below an incumbent of ``upper_s`` seconds (a verified plan's step
    time less the per-step constant), at most ``upper_s``; None when HiGHS is missing or the incumbent
    leaves no room. ``hints``: micro-batch lengths tau of a good plan, near which the first classes are
    finer; ``micro_batches``: a good plan's micro-batches, each as its groups' (size, sample indices), whose
    groups are the first columns beside each sample alone (each in the class of its micro-batch's length).
    Each of ``rounds`` splits the classes the last one used in ``SPLIT``; past ``deadline`` (an instant of
    ``clock``) the round in hand stops with its best Lagrangian bound."""
    highspy = _highs()
    if highspy is None or not math.isfinite(upper_s):
        return None
    jit.load()  # pricing runs thousands of knapsacks
    started = clock()
    setup = first_classes(tables, upper_s, hints, by_kind=False)  # its columns are of one kind
    if setup is None:
        return None
    d, m_low, m_high, highs = setup
    pool = _seeds(tables, d, micro_batches)
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


def _seeds(tables: CostTables, d: _Data, micro_batches: Sequence[Sequence[tuple[int, Sequence[int]]]]) -> list[_Column]:
    """The first columns: every sample alone on its quickest size, and the groups of the given micro-batches
    that fit, each with its micro-batch's length (the longest of its groups' works)."""
    out = []
    for i in range(d.n):
        mine = d.pair_sample == i
        best = int(np.argmin(np.where(mine, d.pair_length, np.inf)))
        out.append(_Column(-1, int(d.pair_size[best]), np.array([i]), float(d.pair_length[best])))
    t = tables.for_bounds.best_time
    lowest = tables.for_bounds.min_degree_index
    for groups in micro_batches:
        mine = []
        for size, members in groups:
            j = int(np.searchsorted(d.deg, size))
            samples = np.asarray(sorted(members), dtype=np.int64)
            if j >= d.k or d.deg[j] != size or samples.size == 0 or (lowest[samples] > j).any():
                continue
            if float(d.lengths[samples].sum()) > d.cap * size:
                continue
            mine.append(_Column(-1, j, samples, float(d.delta[j]) + float(t[samples, j].sum())))
        length = max((c.work for c in mine), default=0.0)
        out += [_Column(-1, c.size, c.samples, c.work, length) for c in mine]
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
    master.upper = upper_s
    pricing = _Pricing(tables, d, highs)
    placed = []
    for c in pool:
        g = int(np.searchsorted(highs, max(c.work, c.length) * (1 - 1e-12)))
        if g < len(highs):
            placed.append(_Column(g, c.size, c.samples, c.work, c.length))
    _add(master, d, lows, highs, placed)
    generated = _generate(master, pricing, d, lows, highs, deadline, clock)
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
            master.row_low[master.count] = master.row_high[master.count] = float(whole)
            side = _generate(master, pricing, d, lows, highs, deadline, clock)
            if side is None:
                sides.clear()
                break
            sides.append(side[0])
            converged = converged and side[1]
        if sides:
            value = max(value, min(sides))
    return value, converged, count, used, [_Column(-1, c.size, c.samples, c.work, c.length) for c in master.columns]


def _generate(
    master: _Master,
    pricing: _Pricing,
    d: _Data,
    lows: list[float],
    highs: list[float],
    deadline: float | None,
    clock: Callable[[], float],
) -> tuple[float, bool, float, set[int]] | None:
    """Column generation on the master as it stands: its bound (the best Lagrangian one, whole or stopped
    at ``deadline``), whether it converged, the micro-batch count and the classes of the last LP; None when
    the first LP fails or reaches the deadline unsolved. Generation stops when pricing finds no column of
    negative reduced cost, or when the best Lagrangian bound is within ``CLOSE`` of the master's value (the
    tail of generation moves the LP by less)."""
    lp = master.lp
    k = master.k
    best_bound = -math.inf
    while True:
        if deadline is not None:  # one LP may take long: it stops at the deadline too (HiGHS's own clock
            # counts every run of the model)
            lp.setOptionValue("time_limit", lp.getRunTime() + max(deadline - clock(), 0.01))
        lp.run()
        lp.setOptionValue("simplex_strategy", SIMPLEX)  # after the first LP, see SIMPLEX
        status = lp.getModelStatus()
        if status != master.optimal and status != master.timed_out:
            lp.clearSolver()  # a warm start the simplex could not finish: solve afresh
            lp.run()
        if lp.getModelStatus() != master.optimal:
            return None if best_bound == -math.inf else (best_bound, False, math.nan, set())
        sol = lp.getSolution()
        if _add_once_rows(master, np.asarray(sol.col_value)):
            continue
        value = float(lp.getInfo().objective_function_value)
        duals = _signed(master, np.asarray(sol.row_dual))
        counts = np.asarray(sol.col_value)[np.arange(master.classes) * (2 + k)]
        count = float(counts.sum())
        used = {int(g) for g in np.flatnonzero(counts > 1e-9)}
        least, found = _price_all(master, pricing, d, lows, duals)
        best_bound = max(best_bound, _lagrange(master, d, lows, highs, duals, least))
        new: list[_Column] = []
        for column in found:
            rows, vals = _coefficients(master, d, lows, highs, column)
            key = (column.cls, column.size, column.samples.tobytes())
            # one already in the master is within the LP's tolerance
            if -float(np.dot(duals[rows], vals)) < -TOLERANCE * max(value, 1e-9) and key not in master.seen:
                master.seen.add(key)
                new.append(column)
        if not new or best_bound >= value * (1 - CLOSE):
            return best_bound, True, count, used
        if deadline is not None and clock() >= deadline:
            return best_bound, False, count, used
        _add(master, d, lows, highs, new)


def _signed(master: _Master, duals: np.ndarray) -> np.ndarray:
    """The duals with the signs their rows allow (>= 0 on rows with no upper bound, <= 0 on rows with no
    lower one): the LP's own are so up to its tolerance, and the Lagrangian bound needs them exactly so."""
    duals = np.where(np.isinf(master.row_high), np.maximum(duals, 0.0), duals)
    return np.where(np.isinf(master.row_low), np.minimum(duals, 0.0), duals)


def _price_all(
    master: _Master, pricing: _Pricing, d: _Data, lows: list[float], duals: np.ndarray
) -> tuple[np.ndarray, list[_Column]]:
    """Per class, the least reduced cost per rank of a column at these duals (at most the true least, and at
    most 0); and the columns pricing found of negative reduced cost (see :meth:`_Pricing.price`)."""
    k = master.k
    pi = duals[master.cover : master.cover + master.n]
    flat = np.zeros(master.classes * master.n)
    if master.once:
        keys = np.fromiter(master.once.keys(), dtype=np.int64)
        flat[keys] = duals[np.fromiter(master.once.values(), dtype=np.int64)]
    once = flat.reshape(master.classes, -1)
    least = np.zeros(master.classes)
    found: list[_Column] = []
    for g in range(master.classes):
        rho = float(duals[master.rank + g])
        for j in range(k):
            at = g * k + j
            reduced, columns = pricing.price(
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
            least[g] = min(least[g], reduced / float(d.deg[j]))
            if reduced < 0:
                found += columns
    return least, found


def _lagrange(
    master: _Master, d: _Data, lows: list[float], highs: list[float], duals: np.ndarray, least: np.ndarray
) -> float:
    """The Lagrangian bound at duals of the right signs: every row priced at the bound its dual's sign
    picks, plus the least the rest can cost.

    Besides the rows, a plan faster than the incumbent U satisfies sum_g x_g <= K, l_g x_g <= S_g <= u_g x_g,
    0 <= W_gd <= u_g N x_g, d y summed over class g at most N x_g, slacks 0, and sum_g (b x_g + S_g) <= U.
    So a micro-batch of class g lasting tau costs the rest at least rc(x_g) + tau rc(S_g) + u_g N sum_d
    min(0, rc(W_gd)) + N ``least``_g (least at an end of the class, the cost being linear in tau), and
    takes b + tau of U: the rest costs at least K times the least per micro-batch, and at least U times
    the least per second of micro-batch, where these are negative (the greater of the two holds)."""
    terms = np.where(duals > 0, np.nan_to_num(master.row_low, neginf=0.0), np.nan_to_num(master.row_high, posinf=0.0))
    rows_part = float(np.dot(duals, terms))
    rows, cols, vals = master.entries
    reduced = master.cost - np.bincount(cols, weights=vals * duals[rows], minlength=master.cost.shape[0])
    per = 2 + master.k
    n_ranks = float(d.n_ranks)
    per_batch = per_second = 0.0
    for g in range(master.classes):
        w = reduced[g * per + 2 : (g + 1) * per]
        base = reduced[g * per] + highs[g] * n_ranks * float(np.minimum(w, 0.0).sum()) + n_ranks * float(least[g])
        for tau in (lows[g], highs[g]):
            each = base + tau * reduced[g * per + 1]
            per_batch = min(per_batch, each)
            if d.b + tau > 0:
                per_second = min(per_second, each / (d.b + tau))
            elif each < 0:
                per_second = -math.inf
    return rows_part + max(float(master.row_high[master.count]) * per_batch, master.upper * per_second)
