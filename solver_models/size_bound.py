"""A linear-programming lower bound that sees group sizes and the memory they waste.

The bounds of :mod:`optimizer.bounds.lower_bounds` let every sample take its cheapest group size and
count memory per token: a sample of 17 ranks' worth of tokens on a group of 32 (the next size the
model's heads allow) leaves 15 ranks' memory idle unless other samples join it, on a group far wider
(and, across nodes, far costlier) than theirs. When memory is tight and every micro-batch costs a
large constant, that choice decides the plan; this LP makes it.

Notation: N ranks, C the largest per-rank capacity, b the group constant, b_d >= b the least constant
of a group of size d, t_i(d) the best time of sample i on a group of size d (intra-node where d fits
a node, fastest GPU), L_i its tokens, d allowed for i when d >= i's memory minimum.

For a plan with M micro-batches and step time S:

- every rank of micro-batch m waits at least b (in a group of size d: b_d plus the group's work, the
  work of sample i being t_i(d); idle: T_m >= b), so
  N S >= N M b + sum_i d_i t_i(d_i) + sum_groups d (b_d - b);
- the groups of one micro-batch hold at most N ranks: sum over all groups of their sizes <= N M;
- a group of size d holds at most C d tokens, and two samples of more than C d / 2 tokens never share
  one.

LP_M relaxes the plan's choice of sizes and group counts: z_id >= 0 the share of sample i on groups of
size d, g_d >= 0 the number of groups of size d (over all micro-batches):

    minimise   sum_id d t_i(d) z_id + sum_d d (b_d - b) g_d
    subject to sum_d z_id = 1                          (every sample somewhere)
               C d g_d >= sum_i L_i z_id                (memory of the groups of size d)
               g_d >= sum_{i: L_i > C d / 2} z_id       (samples over half a group never share one)
               sum_d d g_d <= N M                       (ranks of M micro-batches)

so a plan with M micro-batches has S >= M b + LP_M / N. With an incumbent of step time U, a better
plan has every micro-batch shorter than U - (M - 1) b, so z_id is dropped where b_d + t_i(d) exceeds
that (LP_M infeasible: no better plan with M micro-batches). The bound is the least of M b + LP_M / N
over the micro-batch counts memory and the options allow, and U; counts are tried upwards until
M b plus the least area (over N) reaches the best found (LP_M never rises with M, M b does).

On the plan-quality grid (``docs/results-bound/report.md``: 180 batches of 512 samples, six
profiles) it is the binding bound on 87 batches; on the tiny instances of
``tests/test_bound_oracle.py`` it is never above their brute-force optimum (the test checks it).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from optimizer.costs.tables import CostTables

HALF = 0.5
"""Two samples of more than this share of a group's memory never share the group."""


def _highs() -> Any:
    from solver_models.pulp_milp import highs_module

    return highs_module()


def column_count(tables: CostTables) -> int:
    """Columns of the LP before the incumbent drops any: the (sample, size) pairs memory allows."""
    return int((len(tables.degrees) - tables.min_degree_index).sum()) + len(tables.degrees)


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
    cap = float(tables.rank_capacity.max())
    deg = tables.degrees.astype(np.float64)
    t = tables.best_time
    b_d = np.asarray(tables.best_group_constants, dtype=np.float64)
    lengths = tables.lengths.astype(np.float64)
    n, k = t.shape
    valid = np.arange(k)[None, :] >= tables.min_degree_index[:, None]
    area = np.where(valid, t * deg[None, :], np.inf)
    finish = np.where(valid, b_d[None, :] + t, np.inf)
    least_area = float(area.min(axis=1).sum())
    m_low = max(1, math.ceil(float(lengths.sum()) / (n_ranks * cap) * (1 - 1e-12)))
    m_high = min(int(tables.problem.options.micro_batch_limit), n)
    best = float(upper_s)
    if m_low > m_high or not m_low * b + least_area / n_ranks < best:
        return best if math.isfinite(best) else None

    # Columns: z for every (sample, size) a plan better than the incumbent may use with m_low
    # micro-batches (the widest set: larger counts only drop columns), then g per size. np.nonzero
    # walks the matrix row by row, so the z columns come sorted by sample.
    room = best - (m_low - 1) * b
    ii, jj = np.nonzero(np.isfinite(finish) & (finish <= room))
    per_sample = np.bincount(ii, minlength=n)
    if not per_sample.all():  # a sample finishes nowhere in time: no better plan
        return best if math.isfinite(best) else None
    n_z = ii.shape[0]
    n_cols = n_z + k
    cost = np.concatenate([area[ii, jj], deg * (b_d - b)])
    inf = highspy.kHighsInf
    # Rows in CSR form: one per sample (its z sum to 1), then per size its memory row and its
    # big-sample row (g_j at the head of each), then the rank row.
    z = np.arange(n_z)
    by_size = np.argsort(jj, kind="stable")
    heavy = by_size[lengths[ii[by_size]] > HALF * cap * deg[jj[by_size]]]
    size_count = np.bincount(jj, minlength=k)
    heavy_count = np.bincount(jj[heavy], minlength=k)
    g = n_z + np.arange(k)
    index = [z]
    values = [np.ones(n_z)]
    mem_cols = np.split(by_size, np.cumsum(size_count)[:-1])
    heavy_cols = np.split(heavy, np.cumsum(heavy_count)[:-1])
    row_len = list(per_sample)
    lo = [1.0] * n
    hi = [1.0] * n
    for j in range(k):
        index += [g[j : j + 1], mem_cols[j]]
        values += [np.array([cap * deg[j]]), -lengths[ii[mem_cols[j]]]]
        row_len.append(1 + mem_cols[j].shape[0])
        lo.append(0.0)
        hi.append(inf)
        if heavy_count[j]:
            index += [g[j : j + 1], heavy_cols[j]]
            values += [np.ones(1), -np.ones(heavy_count[j])]
            row_len.append(1 + int(heavy_count[j]))
            lo.append(0.0)
            hi.append(inf)
    rank_row = len(lo)
    index.append(g)
    values.append(deg.copy())
    row_len.append(k)
    lo.append(-inf)
    hi.append(float(n_ranks * m_low))

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
    z_finish = finish[ii, jj]
    dropped = np.zeros(n_z, dtype=bool)
    for m in range(m_low, m_high + 1):
        if not m * b + least_area / n_ranks < best:
            break
        if deadline is not None:
            left = deadline - clock()
            if left <= 0:
                return None
            h.setOptionValue("time_limit", float(left))
        room = best - (m - 1) * b
        newly = ~dropped & (z_finish > room)
        if newly.any():
            cols = np.flatnonzero(newly).astype(np.int32)
            h.changeColsBounds(cols.shape[0], cols, np.zeros(cols.shape[0]), np.zeros(cols.shape[0]))
            dropped |= newly
        h.changeRowBounds(rank_row, -inf, float(n_ranks * m))
        h.run()
        status = h.getModelStatus()
        if status == highspy.HighsModelStatus.kInfeasible:
            continue  # no plan better than the incumbent with m micro-batches
        if status != highspy.HighsModelStatus.kOptimal:
            return None
        # The LP's own feasibility tolerance (1e-7 relative) is taken off so the bound stays a bound.
        value = (m * b + float(h.getInfo().objective_function_value) / n_ranks) * (1 - 1e-6)
        best = min(best, value)
    return best if math.isfinite(best) else None
