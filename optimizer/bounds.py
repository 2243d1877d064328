"""Lower bounds on the step time, valid for every plan of the problem.

Notation: N ranks, b the group constant, t_i(d) the best time of sample i on a group of size d
(intra-node where d fits a node, fastest GPU), m_i the smallest size on which i fits in memory,
C the largest per-rank capacity, S the step time.

1. Single sample: S >= b + min_{d >= m_i} t_i(d) for every i.
2. Rank-time (area): a group of size d busy for T_m in micro-batch m occupies d T_m rank-seconds,
   at least d (b + sum of its samples' t_i(d)). Summing over groups and micro-batches, and using
   T_m <= S:  N S >= sum_i e_i(S) + b * (sum_i L_i) / C, where
   e_i(S) = min { d t_i(d) : d >= m_i, b + t_i(d) <= S } (the sample must finish within S), and
   sum_i L_i / C is the least total group size all micro-batches together need for memory.
   The left side grows with S and the right side shrinks, so the smallest S that satisfies the
   inequality is found by bisection; every S below it is impossible.
The solver backends add LP-relaxation bounds on top of these.
"""

from __future__ import annotations

import numpy as np

from optimizer.costs import CostTables


def single_sample_bound(tables: CostTables) -> float:
    t = tables.best_time
    valid = np.arange(t.shape[1])[None, :] >= tables.min_degree_index[:, None]
    best = np.where(valid, t, np.inf).min(axis=1)
    return float(tables.group_constant + best.max())


def area_bound(tables: CostTables, floor: float = 0.0, rel_tol: float = 1e-5) -> float:
    """Smallest S with sum_i e_i(S) + b sum L / C <= N S (see the module docstring)."""
    t = tables.best_time
    b = tables.group_constant
    n_ranks = tables.n_ranks
    d = tables.degrees.astype(np.float64)[None, :]
    valid = np.arange(t.shape[1])[None, :] >= tables.min_degree_index[:, None]
    area = np.where(valid, t * d, np.inf)
    memory_ranks = float(tables.lengths.sum()) / float(tables.rank_capacity.max())

    lo = max(floor, single_sample_bound(tables))
    # Samples whose cheapest-area size already finishes within lo never change: fold them in once.
    best_j = area.argmin(axis=1)
    best_area = area[np.arange(area.shape[0]), best_j]
    fixed = b + t[np.arange(t.shape[0]), best_j] <= lo
    base = float(best_area[fixed].sum())
    t_act, area_act = t[~fixed], area[~fixed]

    def excess(s: float) -> float:
        if t_act.shape[0]:
            e = np.where(b + t_act <= s, area_act, np.inf).min(axis=1)
            if not np.all(np.isfinite(e)):
                return np.inf
            return base + float(e.sum()) + b * memory_ranks - n_ranks * s
        return base + b * memory_ranks - n_ranks * s

    if excess(lo) <= 0:
        return lo
    hi = lo * 2
    while excess(hi) > 0:
        hi *= 2
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if excess(mid) > 0:
            lo = mid
        else:
            hi = mid
    return lo


def lower_bound(tables: CostTables) -> float:
    return area_bound(tables)
