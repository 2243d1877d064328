"""A lower bound that keeps each micro-batch's memory and time together: one LP over length classes.

The bounds of :mod:`optimizer.bounds.lower_bounds` and the group-size LP of
:mod:`solver_models.size_bound` pool every micro-batch's rank-time and memory. In a plan they come
together: a group of d ranks in a micro-batch of length b + tau holds at most C d tokens *and* works
at most d tau rank-seconds, so a micro-batch full of short samples (little work per token) leaves
ranks idle while another runs long. When memory is tight that idle time decides the step.

Notation as in :mod:`solver_models.size_bound`: N ranks, C the largest per-rank capacity, b the group
constant, b_d >= b the least constant of size d and delta_d = b_d - b, t_i(d) the best time of sample
i on size d (intra-node where d fits a node, fastest GPU), a_i(d) = d t_i(d), L_i its tokens; M the
fewest micro-batches memory allows and K the most the options allow.

**One micro-batch.** Take a micro-batch of a plan the verifier accepts, lasting b + tau, with z_id = 1
when sample i runs in it on a group of size d, and n_d the ranks of its groups of size d. Then

    sum_d z_id <= 1                                (a sample at most once)
    sum_d n_d <= N                                 (the micro-batch's ranks)
    sum_i L_i z_id <= C n_d                        (a group of size d holds at most C d tokens)
    sum_i a_i(d) z_id <= (tau - delta_d) n_d       (a group of size d lasts b_d plus its samples' work)
    d sum_{i: L_i > C d / 2} z_id <= n_d           (two samples of over half a group never share one)
    d z_id <= n_d                                  (a group holding a sample is in the micro-batch whole)
    z_id = 0 where b_d + t_i(d) > b + tau          (a sample finishes within its micro-batch)

and every row still holds when tau is replaced by any larger length. The whole-group row is kept only
where d >= 2 and L_i > C d / 8 (``WHOLE_SHARE``): without it the LP may run a long sample on a sliver
of a wide group, finishing it as soon as the whole group would while paying only its area; on short
samples it seldom binds, and kept for every pair it makes the LP much larger.

**Kinds of GPU.** On ranks of several kinds (:func:`solver_models.size_bound.gpu_kinds`: speed s_q,
capacity C_q, N_q ranks, fastest first) a group is of the kind of its slowest rank, as in the
group-size LP: d above runs over (kind q, size) pairs, t_i(d) and a_i(d) are taken at s_q, C at C_q,
and a pair exists only where the size fits on the N_{<=q} ranks of kind q or faster and the sample in
its memory. The rank row becomes one row per kind q: sum_{r,d} h^q_r(d) n_rd <= N_{<=q}, with
h^q_r(d) the share of a group of kind r and size d that sits on ranks of kinds up to q (1 when
r <= q; for a slower r, what the ranks of kinds q+1 to r cannot hold, over d). On one kind, or kinds
whose faster one holds fewer tokens, everything reads as one kind with every rank the fastest and
roomiest.

**Length classes.** Lengths 0 = tau_0 < tau_1 < ... < tau_G cut (0, tau_G] into classes; class g holds
the micro-batches with tau in (l_g, u_g] = (tau_{g-1}, tau_g]. Over a class's micro-batches let x_g be
their count, Z_gid and N_gd the sums of z_id and n_d, S_g the sum of their lengths tau and W_gd the sum
of tau n_d. Then l_g x_g <= S_g <= u_g x_g, and as each micro-batch has l_g < tau <= u_g and
0 <= n_d <= N (so that (tau - l_g)(N - n_d) >= 0),

    W_gd <= u_g N_gd,    W_gd <= l_g N_gd + N (S_g - l_g x_g),    sum_d W_gd <= N S_g,

(over kinds: N_{<=q} for N in the middle row, and the last per kind with the weights h^q),

and the rows above summed over the class hold with their right sides replaced: W_gd - delta_d N_gd
for the time row, u_g in the finish rows, x_g for the 1 and the N. All of it is linear. The LP

    minimise   sum_g (b x_g + S_g)
    subject to the summed rows of every class,
               sum_gd Z_gid >= 1 for every sample,     M <= sum_g x_g <= K

is therefore at most the step time of every plan whose micro-batches are at most tau_G long (without
the profile's per-step constant, which :func:`optimizer.plan.evaluate.build_plan` adds to the plan and
its bound alike). With an incumbent of step time U, a better plan has every tau below U - M b and at
most U / b micro-batches, so tau_G = U - M b and the answer is the least of U and the LP.

A class's micro-batches are credited up to u_g of each group's time while they may be as short as l_g,
and a sample that finishes within u_g may sit in any of them: finer classes cost less of that. So the
LP is solved on a few classes spaced in log, then again with every class it used split in four, round
after round while time allows; each round's LP is a bound (any cut of (0, tau_G] gives one) and the
best is kept.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from optimizer.costs.tables import CostTables
from solver_models.size_bound import HALF, _highs, gpu_kinds, held_ranks, kind_fits

FIRST_CLASSES = 16
"""Classes of the first round, spaced in log between the fastest finish of any sample and tau_G."""

SPLIT = 4
"""Each class a round's LP used is split into this many for the next round."""

NEAR = tuple(1.0 + 0.01 * step for step in range(-8, 4))
"""Factors on a hinted length where the first round puts class ends: 1% apart, from 8% below to 3% above."""

WHOLE_SHARE = 1 / 8
"""A sample of more than this share of a group's memory (groups of 2 ranks or more) gets the whole-group
row there: a micro-batch that runs it on such a group holds the group's every rank."""

SAFETY = 1e-6
"""The LP's own feasibility tolerance, taken off its value so the bound stays a bound."""


@dataclass(frozen=True)
class ClassBound:
    """The bound in seconds (micro-batches only), the classes of the LP that gave it, the rounds run,
    and the seconds the LPs took."""

    bound_s: float
    classes: int
    rounds: int
    lp_s: float


@dataclass(frozen=True)
class _Data:
    n: int
    k: int
    n_ranks: int
    b: float
    cap: float
    deg: np.ndarray
    delta: np.ndarray
    lengths: np.ndarray
    pair_sample: np.ndarray
    pair_size: np.ndarray
    pair_area: np.ndarray
    pair_length: np.ndarray  # the least micro-batch length tau in which the pair's sample finishes
    pair_heavy: np.ndarray
    memory: float  # tokens one micro-batch holds on every rank
    # Group columns c = q * k + j: groups of GPU kind q (of size_bound.gpu_kinds) and size index j.
    pair_col: np.ndarray
    col_deg: np.ndarray
    col_delta: np.ndarray
    col_cap: np.ndarray
    col_ranks: np.ndarray  # N_{<=q}: the ranks a group of the column's kind may sit on
    held: np.ndarray  # [kinds, columns] the share of a column's group ranks of kinds up to q holds at least
    kind_ranks: np.ndarray  # [kinds] N_{<=q}
    pair_whole: np.ndarray  # the pair gets a row of its own: its group's every rank is in its micro-batch


def _data(tables: CostTables, by_kind: bool = True) -> _Data:
    """The LP's data; ``by_kind`` False counts every rank as the fastest and roomiest (one kind)."""
    tables = tables.for_bounds
    deg = tables.degrees.astype(np.float64)
    n, k = tables.n_samples, deg.shape[0]
    b = float(tables.group_constant)
    b_d = np.asarray(tables.best_group_constants, dtype=np.float64)
    cap = float(tables.rank_capacity.max())
    lengths = tables.lengths.astype(np.float64)
    kinds = gpu_kinds(tables) if by_kind else [(float(tables.rank_speed.max()), cap, tables.n_ranks)]
    valid = np.arange(k)[None, :] >= tables.min_degree_index[:, None]
    ii, jj, cc, area, finish, heavy, whole = [], [], [], [], [], [], []
    for q, (speed, kind_cap, _) in enumerate(kinds):
        t_q = tables.best_time_at(speed)  # best_time itself at the fastest speed
        fits = valid if len(kinds) == 1 else valid & kind_fits(kinds, q, deg, lengths)
        i_q, j_q = np.nonzero(fits)
        ii.append(i_q)
        jj.append(j_q)
        cc.append(q * k + j_q)
        area.append(t_q[i_q, j_q] * deg[j_q])
        finish.append(b_d[j_q] + t_q[i_q, j_q] - b)
        heavy.append(lengths[i_q] > HALF * kind_cap * deg[j_q])
        whole.append((deg[j_q] >= 2) & (lengths[i_q] > WHOLE_SHARE * kind_cap * deg[j_q]))
    counts = np.array([count for _, _, count in kinds], dtype=np.float64)
    below = np.cumsum(counts)
    return _Data(
        n=n,
        k=k,
        n_ranks=tables.n_ranks,
        b=b,
        cap=cap,
        deg=deg,
        delta=b_d - b,
        lengths=lengths,
        pair_sample=np.concatenate(ii),
        pair_size=np.concatenate(jj),
        pair_area=np.concatenate(area),
        pair_length=np.concatenate(finish),
        pair_heavy=np.concatenate(heavy),
        memory=float(sum(kind_cap * count for _, kind_cap, count in kinds)),
        pair_col=np.concatenate(cc),
        col_deg=np.tile(deg, len(kinds)),
        col_delta=np.tile(b_d - b, len(kinds)),
        col_cap=np.repeat([kind_cap for _, kind_cap, _ in kinds], k),
        col_ranks=np.repeat(below, k),
        held=np.stack([held_ranks(kinds, q, deg).reshape(-1) for q in range(len(kinds))]) / np.tile(deg, len(kinds)),
        kind_ranks=below,
        pair_whole=np.concatenate(whole),
    )


def _charged(low: float, high: float) -> float:
    """The least length l_g a micro-batch of the class (low, high] is taken to have."""
    return low


class _Rows:
    """Rows gathered as (row, column, value) triplets, then handed to HiGHS in CSR form."""

    def __init__(self) -> None:
        self.row: list[np.ndarray] = []
        self.col: list[np.ndarray] = []
        self.val: list[np.ndarray] = []
        self.lower: list[np.ndarray] = []
        self.upper: list[np.ndarray] = []
        self.count = 0

    def add(
        self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n_rows: int, lower: float, upper: float
    ) -> None:
        """``n_rows`` new rows; ``rows`` numbers them from 0."""
        self.row.append(rows + self.count)
        self.col.append(cols)
        self.val.append(vals)
        self.lower.append(np.full(n_rows, lower))
        self.upper.append(np.full(n_rows, upper))
        self.count += n_rows

    def csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        row = np.concatenate(self.row)
        order = np.argsort(row, kind="stable")
        starts = np.searchsorted(row[order], np.arange(self.count)).astype(np.int32)
        return (
            np.concatenate(self.lower),
            np.concatenate(self.upper),
            starts,
            np.concatenate(self.col)[order].astype(np.int32),
            np.concatenate(self.val)[order].astype(np.float64),
        )


def _length_sum_rows(
    rows: _Rows, x: int, lengths: int, w: np.ndarray, n: np.ndarray, low: float, high: float, d: _Data
) -> None:
    """The rows of a class (low, high] that tie S_g (column ``lengths``) and W_gc (columns ``w``) to x_g and
    N_gc (columns ``n``): l x <= S <= u x, W_c <= u N_c, W_c <= l N_c + N_{<=q} (S - l x) for a column of
    kind q, and per kind q sum_c h^q_c W_c <= N_{<=q} S."""
    inf = math.inf
    c = w.shape[0]
    pair = np.zeros(2, dtype=np.int64)
    rows.add(pair, np.array([lengths, x]), np.array([1.0, -low]), 1, 0.0, inf)
    rows.add(pair, np.array([lengths, x]), np.array([1.0, -high]), 1, -inf, 0.0)
    per_col = np.arange(c)
    rows.add(np.tile(per_col, 2), np.concatenate([w, n]), np.concatenate([np.ones(c), np.full(c, -high)]), c, -inf, 0.0)
    rows.add(
        np.tile(per_col, 4),
        np.concatenate([w, n, np.full(c, lengths), np.full(c, x)]),
        np.concatenate([np.ones(c), np.full(c, -low), -d.col_ranks, d.col_ranks * low]),
        c,
        -inf,
        0.0,
    )
    _per_kind_rows(rows, d, w, lengths)


def _per_kind_rows(rows: _Rows, d: _Data, cols: np.ndarray, total: int) -> None:
    """Per GPU kind q: sum_c h^q_c cols[c] - N_{<=q} total <= 0 (the share of each column's groups on ranks of
    kinds up to q, against those ranks)."""
    for share, ranks in zip(d.held, d.kind_ranks, strict=True):
        on = np.flatnonzero(share > 0)
        rows.add(
            np.zeros(on.shape[0] + 1, dtype=np.int64),
            np.append(cols[on], total),
            np.append(share[on], -float(ranks)),
            1,
            -math.inf,
            0.0,
        )


def _solve(
    highspy, d: _Data, taus: list[float], m_low: int, m_high: int, limit_s: float
) -> tuple[float, list[int]] | None:
    """The LP of the module docstring on the classes ending at ``taus`` (ascending): its value and the
    classes it uses, or None when HiGHS fails or runs past ``limit_s``."""
    inf = highspy.kHighsInf
    k = d.col_deg.shape[0]  # group columns: (kind, size)
    rows = _Rows()
    cost: list[np.ndarray] = []
    cover_cols: list[np.ndarray] = []
    cover_rows: list[np.ndarray] = []
    count_cols: list[int] = []
    classes: list[int] = []
    col = 0
    below = 0.0
    for g, tau in enumerate(taus):
        sel = np.flatnonzero(d.pair_length <= tau)
        floor, below = below, tau
        if sel.shape[0] == 0:
            continue  # such micro-batches hold nothing: they cost b each and cover no sample
        ii, jj = d.pair_sample[sel], d.pair_col[sel]
        z = col + np.arange(sel.shape[0])
        n_col = col + sel.shape[0] + np.arange(k)
        x = col + sel.shape[0] + k
        lengths = x + 1  # S_g
        w_col = lengths + 1 + np.arange(k)  # W_gc
        col = lengths + 1 + k
        cost += [np.zeros(sel.shape[0] + k), np.array([d.b, 1.0]), np.zeros(k)]
        _length_sum_rows(rows, x, lengths, w_col, n_col, _charged(floor, tau), tau, d)
        classes.append(g)
        count_cols.append(x)
        cover_cols.append(z)
        cover_rows.append(ii)
        # a sample at most once per micro-batch: sum_c Z_gic - x_g <= 0
        samples, local = np.unique(ii, return_inverse=True)
        rows.add(
            np.concatenate([local, np.arange(samples.shape[0])]),
            np.concatenate([z, np.full(samples.shape[0], x)]),
            np.concatenate([np.ones(z.shape[0]), -np.ones(samples.shape[0])]),
            samples.shape[0],
            -inf,
            0.0,
        )
        _per_kind_rows(rows, d, n_col, x)  # ranks, per kind q: sum_c h^q_c N_gc - N_{<=q} x_g <= 0
        # memory and time per column: sum L Z - C_q N <= 0, sum a Z - (W - delta_d N) <= 0
        rows.add(
            np.concatenate([jj, np.arange(k)]),
            np.concatenate([z, n_col]),
            np.concatenate([d.lengths[ii], -d.col_cap]),
            k,
            -inf,
            0.0,
        )
        rows.add(
            np.concatenate([jj, np.arange(k), np.arange(k)]),
            np.concatenate([z, n_col, w_col]),  # sum a Z + delta_d N - W <= 0
            np.concatenate([d.pair_area[sel], d.col_delta, -np.ones(k)]),
            k,
            -inf,
            0.0,
        )
        # a group's ranks whenever it holds a sample: d Z_gic - N_gc <= 0 (pairs of groups of 2 or more)
        wide = np.flatnonzero(d.pair_whole[sel])
        if wide.shape[0]:
            rows.add(
                np.tile(np.arange(wide.shape[0]), 2),
                np.concatenate([z[wide], n_col[jj[wide]]]),
                np.concatenate([d.col_deg[jj[wide]], -np.ones(wide.shape[0])]),
                wide.shape[0],
                -inf,
                0.0,
            )
        heavy = d.pair_heavy[sel]
        if heavy.any():
            cols = np.unique(jj[heavy])
            slot = np.searchsorted(cols, jj[heavy])
            rows.add(
                np.concatenate([slot, np.arange(cols.shape[0])]),
                np.concatenate([z[heavy], n_col[cols]]),
                np.concatenate([d.col_deg[jj[heavy]], -np.ones(cols.shape[0])]),
                cols.shape[0],
                -inf,
                0.0,
            )
    sample_of = np.concatenate(cover_rows)
    if np.bincount(sample_of, minlength=d.n).min() == 0:
        return None  # some sample finishes in no class: no plan within tau_G
    rows.add(sample_of, np.concatenate(cover_cols), np.ones(sample_of.shape[0]), d.n, 1.0, inf)
    counts = np.asarray(count_cols)
    rows.add(
        np.zeros(counts.shape[0], dtype=np.int64), counts, np.ones(counts.shape[0]), 1, float(m_low), float(m_high)
    )
    lp = highspy.Highs()
    lp.setOptionValue("output_flag", False)
    lp.setOptionValue("threads", 1)
    lp.setOptionValue("solver", "ipm")  # three times the dual simplex's speed on these LPs; crossover stays on
    lp.setOptionValue("time_limit", max(limit_s, 1e-3))
    lp.addCols(
        col,
        np.concatenate(cost),
        np.zeros(col),
        np.full(col, inf),
        0,
        np.zeros(0, np.int32),
        np.zeros(0, np.int32),
        np.zeros(0),
    )
    lower, upper, starts, index, values = rows.csr()
    lp.addRows(rows.count, lower, upper, index.shape[0], starts, index, values)
    lp.run()
    if lp.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    solution = np.asarray(lp.getSolution().col_value)
    used = [g for g, x in zip(classes, count_cols, strict=True) if solution[x] > 1e-9]
    return float(lp.getInfo().objective_function_value) * (1 - SAFETY), used


def _refined(taus: list[float], used: set[int]) -> set[float]:
    """The next round's class ends: every class the LP used split in ``SPLIT``. (Merging the classes it
    left unused keeps the LP smaller but lets it charge wide classes their short end: the bound stalls.)"""
    out = set(taus)
    for g in used:
        low = taus[g - 1] if g else 0.0
        out.update(low + (taus[g] - low) * f / SPLIT for f in range(1, SPLIT))
    return out


def first_classes(
    tables: CostTables, upper_s: float, hints: tuple[float, ...], by_kind: bool = True
) -> tuple[_Data, int, int, list[float]] | None:
    """What a class LP below an incumbent of ``upper_s`` starts from: the tables' data (per GPU kind unless
    ``by_kind`` is False), the fewest (M) and most (K) micro-batches, and the first round's class ends
    (``FIRST_CLASSES`` in log up to tau_G, finer near ``hints``); None when the incumbent leaves no room."""
    d = _data(tables, by_kind)
    m_low = max(1, math.ceil(float(d.lengths.sum()) / d.memory * (1 - 1e-12)))
    m_high = min(int(tables.problem.options.micro_batch_limit), d.n)
    if d.b > 0:
        m_high = min(m_high, int(math.floor(upper_s / d.b)))
    tau_high = upper_s - m_low * d.b
    fastest = np.full(d.n, np.inf)
    np.minimum.at(fastest, d.pair_sample, d.pair_length)
    if m_low > m_high or not float(fastest.max()) <= tau_high:
        return None
    taus = sorted(
        {float(x) for x in np.geomspace(max(float(fastest.min()), 1e-9), tau_high, FIRST_CLASSES)}
        | {float(h * f) for h in hints for f in NEAR if 0 < h * f < tau_high}
    )
    return d, m_low, m_high, taus


def length_class_bound(
    tables: CostTables,
    upper_s: float,
    rounds: int = 8,
    hints: tuple[float, ...] = (),
    deadline: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> ClassBound | None:
    """The bound of the module docstring below an incumbent of ``upper_s`` seconds (a verified plan's
    step time less the per-step constant), at most ``upper_s``; None when HiGHS is missing, no round's
    LP finishes before ``deadline`` (an instant of ``clock``), or the incumbent leaves no room. ``hints``:
    micro-batch lengths tau of a good plan; the first round's classes are finer near them (``NEAR``)."""
    highspy = _highs()
    if highspy is None or not math.isfinite(upper_s):
        return None
    setup = first_classes(tables, upper_s, hints)
    if setup is None:
        return None
    d, m_low, m_high, taus = setup
    best: ClassBound | None = None
    started = clock()
    done = 0
    for done in range(1, rounds + 1):
        left = math.inf if deadline is None else deadline - clock()
        if left <= 0:
            break
        t0 = clock()
        solved = _solve(highspy, d, taus, m_low, m_high, left)
        if solved is None:
            break
        value, used = solved
        if best is None or value > best.bound_s:
            best = ClassBound(bound_s=min(value, upper_s), classes=len(taus), rounds=done, lp_s=clock() - started)
        if value >= upper_s:
            break
        finer = _refined(taus, set(used))
        grown = len(finer) / len(taus)
        taus = sorted(finer)
        if deadline is not None and clock() + (clock() - t0) * grown > deadline:
            break  # the next round's LP, about as much larger as it has more classes, would not finish
    if best is None:
        return None
    return ClassBound(bound_s=best.bound_s, classes=best.classes, rounds=done, lp_s=clock() - started)
