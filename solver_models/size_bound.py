"""A linear-programming lower bound that sees group sizes and the memory they waste.

The bounds of :mod:`optimizer.bounds.lower_bounds` let every sample take its cheapest group size and
count memory per token: a sample of 17 ranks' worth of tokens on a group of 32 (the next size the
model's heads allow) leaves 15 ranks' memory idle unless other samples join it, on a group far wider
(and, across nodes, far costlier) than theirs. When memory is tight and every micro-batch costs a
large constant, that choice decides the plan; this LP makes it.

Notation: N ranks, b the group constant, b_d >= b the least constant of a group of size d, L_i the
tokens of sample i, d allowed for i when d >= i's memory minimum (at the roomiest rank).

**Kinds of GPU.** Ranks come in kinds q (speed s_q, capacity C_q, N_q ranks), fastest first; when a
faster kind never holds fewer tokens, a group is of the kind of its slowest rank: its samples run at
that speed, it holds C_q tokens a rank, and its ranks are of kind q or faster. t^q_i(d) is sample i's
time on such a group (the cheapest placement, as on the fastest GPU). When kinds are not so ordered,
one kind stands for all: every rank as the fastest and roomiest (weaker, still a bound). On a cluster
of one kind everything below reads with q dropped.

For a plan with M micro-batches and step time S, micro-batch m lasting T_m = b + tau_m, every group
of micro-batch m works at most tau_m besides its constant (a group of size d: b_d - b plus its work,
the work of sample i being t^q_i(d)), so with tau = sum_m tau_m:

- a group of kind q holds at most N_{<=q} ranks (it sits on ranks of kind q or faster), and a group of
  kind q and size d holds no sample of more than C_q d tokens;
- a group of kind r and size d holds at least h^q_r(d) ranks of kinds up to q: all d when r <= q, and
  d - N_{(q, r]} when r is slower (the ranks of kinds q+1 to r run out), for as long as it works;
- the N_{<=q} ranks of kinds up to q each wait tau: N_{<=q} tau >= the share of every group's area on
  them, sum_i h^q_r(d_i) t^r_i(d_i) plus sum_groups h^q_r(d) (b_d - b);
- and they hold at most N_{<=q} group ranks per micro-batch: sum_groups h^q_r(d) <= N_{<=q} M;
- a group of kind q and size d holds at most C_q d tokens, two samples of more than C_q d / 2
  tokens never share one, and the samples it holds weigh at most 1 in quarters, u(x) of a sample
  with x of the group's memory being 1 past 3/4, 2/3 past 1/2, 1/3 past 1/4 and 0 below
  (:func:`quarters`).

LP_M relaxes the plan's choice of kinds, sizes and group counts: z_qid >= 0 the share of sample i on
groups of kind q and size d, g_qd >= 0 the number of such groups (over all micro-batches):

    minimise   tau
    subject to sum_qd z_qid = 1                                                   (every sample somewhere)
               C_q d g_qd >= sum_i L_i z_qid                                       (memory)
               g_qd >= sum_{i: L_i > C_q d / 2} z_qid                              (big samples never share)
               g_qd >= sum_i u(L_i / (C_q d)) z_qid                                (quarters)
               sum_rd h^q_r(d) g_rd <= N_{<=q} M                                   (ranks of M micro-batches)
               sum_rd h^q_r(d) (sum_i t^r_i(d) z_rid + (b_d - b) g_rd) <= N_{<=q} tau      (waiting)

so a plan with M micro-batches has S >= M b + LP_M. With an incumbent of step time U, a better plan
with M micro-batches puts sample i on no group that would bring it to U: i's micro-batch lasts at
least b_d + t^q_i(d), and the others at least (M - 1) b plus w_i (:func:`others_wait`: the least area
e_j of the samples that i's micro-batch cannot hold, over N; its memory less L_i holds at most the
most least area that fits by area per token). So z_qid is dropped where b_d + t^q_i(d) + w_i exceeds
U - (M - 1) b (LP_M infeasible: no better plan with M micro-batches). The bound is the least of
M b + LP_M over the micro-batch counts memory (sum_q N_q C_q tokens a micro-batch) and the options
allow, and U; counts are tried upwards until M b plus the least tau of any count (the fastest kind's
least area over N, and the speed-weighted one of :mod:`optimizer.bounds.speed_bound`) reaches the
best found: every larger count gives at least that.

On the plan-quality grid (``docs/results-bound/report.md``: 180 batches of 512 samples, six
profiles) it is the binding bound on 151 batches; on the tiny instances of
``tests/test_bound_oracle.py`` it is never above their brute-force optimum (the test checks it).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from optimizer.bounds.long_sample import OtherFill
from optimizer.costs.tables import CostTables

HALF = 0.5
"""Two samples of more than this share of a group's memory never share the group."""


def _highs() -> Any:
    from solver_models.pulp_milp import highs_module

    return highs_module()


def column_count(tables: CostTables, kinds: int) -> int:
    """Columns of the LP before the incumbent drops any: per kind of GPU (``kinds``, the length of
    :func:`gpu_kinds`), the (sample, size) pairs memory allows and the group counts."""
    pairs = int((len(tables.degrees) - tables.min_degree_index).sum()) + len(tables.degrees)
    return pairs * kinds + 1


def gpu_kinds(tables: CostTables) -> list[tuple[float, float, int]]:
    """The ranks' kinds as (speed, capacity, count), fastest first, when a faster kind never holds fewer
    tokens (a group is then of the kind of its slowest rank, in speed and in memory); otherwise one kind,
    every rank counted as the fastest and roomiest (a weaker bound, still a bound)."""
    pairs = np.stack([tables.rank_speed, tables.rank_capacity], axis=1)
    unique, counts = np.unique(pairs, axis=0, return_counts=True)
    order = np.lexsort((-unique[:, 1], -unique[:, 0]))
    kinds = [(float(unique[o, 0]), float(unique[o, 1]), int(counts[o])) for o in order]
    if any(kinds[q][1] < kinds[q + 1][1] for q in range(len(kinds) - 1)):
        return [(float(tables.rank_speed.max()), float(tables.rank_capacity.max()), tables.n_ranks)]
    return kinds


def quarters(share: np.ndarray) -> np.ndarray:
    """Each sample's weight in its group's quarters row, from its share of the group's memory: 1 past
    three quarters, 2/3 past a half, 1/3 past a quarter, else 0. A group holds samples whose weights add
    up to at most 1 (four samples past a quarter, or one past three quarters with another past a
    quarter, never fit; this is the dual-feasible function floor(4x)/3 of bin packing, rounded down at
    its steps)."""
    return np.floor(np.minimum(share, 1.0) * 4.0 - 1e-12).clip(0.0, 3.0) / 3.0


def others_wait(tables: CostTables, least: np.ndarray) -> np.ndarray:
    """[n] per sample i, the least time the micro-batches without i take beyond their constants: the
    least area of the samples that i's micro-batch cannot hold (all memory but i's tokens, filled with the
    most least-area per token) over the ranks."""
    lengths = tables.lengths.astype(np.float64)
    others = OtherFill(lengths, least)
    memory = float(tables.rank_capacity.sum())
    total = float(least.sum())
    fill = others.without(np.arange(lengths.shape[0]), memory - lengths)
    return np.maximum(0.0, total - least - fill) / tables.n_ranks


def kind_fits(kinds: list[tuple[float, float, int]], q: int, deg: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """[n, D] whether a group of kind ``q`` (of :func:`gpu_kinds`) and each size may hold each sample: the
    size fits on the ranks of kind q or faster, and the sample in the size's memory at kind q."""
    ranks = sum(count for _, _, count in kinds[: q + 1])
    return (deg[None, :] <= ranks) & (lengths[:, None] <= kinds[q][1] * deg[None, :])


def held_ranks(kinds: list[tuple[float, float, int]], q: int, deg: np.ndarray) -> np.ndarray:
    """[kinds, D] the ranks of kinds up to ``q`` that a group of each kind and size holds at least: all of
    them for a kind up to q; for a slower kind r, those past the ranks of kinds q+1 to r."""
    counts = np.array([count for _, _, count in kinds], dtype=np.float64)
    beyond = np.concatenate([np.zeros(q + 1), np.cumsum(counts[q + 1 :])])
    return np.maximum(0.0, deg[None, :] - beyond[:, None])


def size_bound(
    tables: CostTables,
    upper_s: float = math.inf,
    deadline: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> float | None:
    """The bound of the module docstring in seconds (at most ``upper_s``), or None when HiGHS is
    missing, fails, or ``deadline`` (an instant of ``clock``) passes first."""
    highspy = _highs()
    if highspy is None:
        return None
    tables = tables.for_bounds
    b = float(tables.group_constant)
    n_ranks = tables.n_ranks
    kinds = gpu_kinds(tables)
    deg = tables.degrees.astype(np.float64)
    b_d = np.asarray(tables.best_group_constants, dtype=np.float64)
    lengths = tables.lengths.astype(np.float64)
    n, k = tables.best_time.shape
    valid = np.arange(k)[None, :] >= tables.min_degree_index[:, None]
    # Per kind q: the area and the finish of each (sample, size) on groups of that kind, where the size
    # fits on the ranks of kind q or faster and the sample in the size's memory at kind q.
    areas = []
    finishes = []
    for q, (speed, _, _) in enumerate(kinds):
        t = tables.best_time_at(speed)
        fits = valid & kind_fits(kinds, q, deg, lengths)
        areas.append(np.where(fits, t * deg[None, :], np.inf))
        finishes.append(np.where(fits, b_d[None, :] + t, np.inf))

    # The least tau any count can give: the fastest kind's area over every rank, and the slowest kind's
    # weighted by each rank's speed (see optimizer.bounds.speed_bound), the stop of the loop over counts.
    def least_areas(speed: float) -> np.ndarray:
        return np.where(valid, tables.best_time_at(speed) * deg[None, :], np.inf).min(axis=1)

    fastest = least_areas(kinds[0][0])  # each sample's least area on the fastest GPU (kinds[0] is the fastest)
    least = float(fastest.sum()) / n_ranks
    if len(kinds) > 1:
        slow = kinds[-1][0]
        least = max(least, slow * float(least_areas(slow).sum()) / float(tables.rank_speed.sum()))
    memory = sum(cap * count for _, cap, count in kinds)
    m_low = max(1, math.ceil(float(lengths.sum()) / memory * (1 - 1e-12)))
    m_high = min(int(tables.problem.options.micro_batch_limit), n)
    best = float(upper_s)
    if m_low > m_high or not m_low * b + least < best:
        return best if math.isfinite(best) else None

    # Columns: z for every (kind, sample, size) a plan better than the incumbent may use with m_low
    # micro-batches (the widest set: larger counts only drop columns), then g per (kind, size), then tau.
    # np.nonzero walks each matrix row by row, so within a kind the z columns come sorted by sample.
    room = best - (m_low - 1) * b
    if math.isfinite(best):
        wait = others_wait(tables, fastest)
        finishes = [f + wait[:, None] for f in finishes]
    kq, ii, jj, z_area, z_finish = [], [], [], [], []
    for q in range(len(kinds)):
        i_q, j_q = np.nonzero(np.isfinite(finishes[q]) & (finishes[q] <= room))
        kq.append(np.full(i_q.shape[0], q))
        ii.append(i_q)
        jj.append(j_q)
        z_area.append(areas[q][i_q, j_q])
        z_finish.append(finishes[q][i_q, j_q])
    kq_a, ii_a, jj_a = np.concatenate(kq), np.concatenate(ii), np.concatenate(jj)
    per_sample = np.bincount(ii_a, minlength=n)
    if not per_sample.all():  # a sample finishes nowhere in time: no better plan
        return best if math.isfinite(best) else None
    n_z = ii_a.shape[0]
    n_k = len(kinds)
    g0 = n_z  # g of kind q and size j: column g0 + q * k + j
    tau = n_z + n_k * k
    n_cols = tau + 1
    cost = np.zeros(n_cols)
    cost[tau] = 1.0
    inf = highspy.kHighsInf
    # Rows in CSR form: one per sample (its z sum to 1), then per kind and size its memory row and its
    # big-sample row (g at the head of each), then per kind q the rank row and the time row of the kinds
    # up to q (groups of kind q hold only ranks of kind q or faster).
    z = np.arange(n_z)
    by_sample = np.argsort(ii_a, kind="stable")
    index = [z[by_sample]]
    values = [np.ones(n_z)]
    row_len = list(per_sample)
    lo = [1.0] * n
    hi = [1.0] * n
    for q, (_, cap, _) in enumerate(kinds):
        mine = np.flatnonzero(kq_a == q)
        by_size = mine[np.argsort(jj_a[mine], kind="stable")]
        heavy = by_size[lengths[ii_a[by_size]] > HALF * cap * deg[jj_a[by_size]]]
        mem_cols = np.split(by_size, np.cumsum(np.bincount(jj_a[by_size], minlength=k))[:-1])
        heavy_cols = np.split(heavy, np.cumsum(np.bincount(jj_a[heavy], minlength=k))[:-1])
        for j in range(k):
            g = g0 + q * k + j
            index += [np.array([g]), mem_cols[j]]
            values += [np.array([cap * deg[j]]), -lengths[ii_a[mem_cols[j]]]]
            row_len.append(1 + mem_cols[j].shape[0])
            lo.append(0.0)
            hi.append(inf)
            if heavy_cols[j].shape[0]:
                index += [np.array([g]), heavy_cols[j]]
                values += [np.ones(1), -np.ones(heavy_cols[j].shape[0])]
                row_len.append(1 + heavy_cols[j].shape[0])
                lo.append(0.0)
                hi.append(inf)
            weight = quarters(lengths[ii_a[mem_cols[j]]] / (cap * deg[j]))
            counted = weight > 0
            if counted.any():
                index += [np.array([g]), mem_cols[j][counted]]
                values += [np.ones(1), -weight[counted]]
                row_len.append(1 + int(counted.sum()))
                lo.append(0.0)
                hi.append(inf)
    area_all = np.concatenate(z_area)
    rank_rows = []
    ranks_up_to = np.cumsum([count for _, _, count in kinds])
    for q in range(n_k):
        held = held_ranks(kinds, q, deg)
        gs = g0 + np.flatnonzero(held.ravel() > 0)
        rank_rows.append(len(lo))
        index.append(gs)
        values.append(held.ravel()[gs - g0])
        row_len.append(gs.shape[0])
        lo.append(-inf)
        hi.append(float(ranks_up_to[q] * m_low))
        share = held[kq_a, jj_a] / deg[jj_a]
        zs = np.flatnonzero(share > 0)
        index += [zs, gs, np.array([tau])]
        values += [
            area_all[zs] * share[zs],
            (held * (b_d - b)[None, :]).ravel()[gs - g0],
            np.array([-float(ranks_up_to[q])]),
        ]
        row_len.append(zs.shape[0] + gs.shape[0] + 1)
        lo.append(-inf)
        hi.append(0.0)

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("presolve", "off")  # HiGHS presolve took 1 s on LPs the simplex solves in 25 ms
    h.addCols(
        n_cols,
        cost,
        np.zeros(n_cols),
        np.full(n_cols, inf),
        0,
        np.zeros(0, dtype=np.int32),
        np.zeros(0, dtype=np.int32),
        np.zeros(0),
    )
    starts = np.concatenate([[0], np.cumsum(row_len)[:-1]]).astype(np.int32)
    flat_index = np.concatenate(index).astype(np.int32)
    h.addRows(
        len(lo),
        np.array(lo),
        np.array(hi),
        flat_index.shape[0],
        starts,
        flat_index,
        np.concatenate(values).astype(np.float64),
    )
    z_finish_all = np.concatenate(z_finish)
    dropped = np.zeros(n_z, dtype=bool)
    for m in range(m_low, m_high + 1):
        if not m * b + least < best:
            break
        if deadline is not None:
            left = deadline - clock()
            if left <= 0:
                return None
            h.setOptionValue("time_limit", float(left))
        room = best - (m - 1) * b
        newly = ~dropped & (z_finish_all > room)
        if newly.any():
            cols = np.flatnonzero(newly).astype(np.int32)
            h.changeColsBounds(cols.shape[0], cols, np.zeros(cols.shape[0]), np.zeros(cols.shape[0]))
            dropped |= newly
        for q, row in enumerate(rank_rows):
            h.changeRowBounds(row, -inf, float(ranks_up_to[q] * m))
        h.run()
        status = h.getModelStatus()
        if status not in (highspy.HighsModelStatus.kOptimal, highspy.HighsModelStatus.kInfeasible):
            # The simplex without presolve can end undecided on an LP that a tight incumbent has nearly
            # emptied (kUnknown); presolve settles it.
            h.clearSolver()
            h.setOptionValue("presolve", "on")
            h.run()
            h.setOptionValue("presolve", "off")
            status = h.getModelStatus()
        if status == highspy.HighsModelStatus.kInfeasible:
            continue  # no plan better than the incumbent with m micro-batches
        if status != highspy.HighsModelStatus.kOptimal:
            return None
        # The LP's own feasibility tolerance (1e-7 relative) is taken off so the bound stays a bound.
        value = (m * b + float(h.getInfo().objective_function_value)) * (1 - 1e-6)
        best = min(best, value)
    return best if math.isfinite(best) else None
