"""A lower bound for clusters of mixed GPU types: rank-seconds weighted by each rank's speed.

The area bound of :mod:`optimizer.bounds.lower_bounds` counts every rank as one of the fastest GPU,
which on a cluster where some ranks run at a third of the speed leaves the bound far below any
plan. Weighting each rank's seconds by its speed s_r fixes that.

Notation as in :mod:`optimizer.bounds.lower_bounds`; s_r the speed of rank r (the profile's own GPU
is 1), s_min the slowest, t_i(d, s) sample i's time on a group of size d whose slowest rank has
speed s (compute is divided by s, communication is not). A group g of size d_g and speed s_g in a
micro-batch lasting T >= t_g = b + sum of its samples' t_i(d_g, s_g) gives

    sum over its ranks of s_r T >= d_g s_g t_g >= d_g (s_min b + sum_i s_min t_i(d_g, s_min)),

because s t_i(d, s) does not decrease with s (compute contributes the same amount whatever s,
communication s times its time) and s_r >= s_g >= s_min. Let e_i = s_min min_{d >= m_i} d t_i(d, s_min)
(each size on its best placement). Summing over groups and micro-batches, with W = sum_r s_r:

- memory: W S >= sum_i e_i + s_min b (sum_i L_i) / C, the groups' sizes adding up to at least the
  batch's tokens over the largest capacity;
- micro-batches: W S >= sum_i e_i + M s_min b N, every rank busy or waiting at least b in each of at
  least M micro-batches (a rank left out of a micro-batch still waits for it).

On a cluster of one GPU type W = N and s_min = 1, and both are weaker forms of the area bounds, so
the bound is only computed when speeds differ.
"""

from __future__ import annotations

import numpy as np

from optimizer.costs.tables import CostTables


def speed_weighted_bound(tables: CostTables, fewest: int) -> float | None:
    """The larger of the two bounds of the module docstring (``fewest``: the least micro-batch count
    memory allows), or None on a cluster of one speed."""
    speeds = tables.rank_speed
    if float(speeds.min()) == float(speeds.max()):
        return None
    slow = float(speeds.min())
    inter = tables.time_matrix(False, slow)
    fits = tables.degrees <= tables.node_size
    times = np.where(fits[None, :], np.minimum(tables.time_matrix(True, slow), inter), inter)
    area = times * tables.degrees.astype(np.float64)[None, :]
    too_small = np.arange(len(tables.degrees))[None, :] < tables.min_degree_index[:, None]
    area[too_small] = np.inf
    work = slow * float(area.min(axis=1).sum())
    b = tables.group_constant
    memory = work + slow * b * float(tables.lengths.sum()) / float(tables.rank_capacity.max())
    micro_batches = work + fewest * slow * b * tables.n_ranks
    return max(memory, micro_batches) / float(speeds.sum())
