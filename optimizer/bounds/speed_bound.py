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
- micro-batches: S >= M b + sum_i e_i / W. Micro-batch m lasts T_m = b + tau_m (tau_m >= 0: every
  group lasts at least its constant b_d >= b), so S = sum_m T_m >= M b + sum_m tau_m over at least
  M micro-batches. A rank r of group g waits tau_m >= t_g - b >= sum of g's t_i(d_g, s_g) (the group
  constant is not divided by the speed), so sum_r s_r tau_m >= d_g s_g sum_i t_i(d_g, s_g) summed over
  the groups of m, and over all micro-batches W sum_m tau_m >= sum_i e_i. (The constant b is counted
  once per micro-batch in wall-clock time, not once per rank in rank-seconds, where the slow ranks
  would discount it by s_min N / W.)

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
    area = tables.best_time_at(slow) * tables.degrees.astype(np.float64)[None, :]
    too_small = np.arange(len(tables.degrees))[None, :] < tables.min_degree_index[:, None]
    area[too_small] = np.inf
    work = slow * float(area.min(axis=1).sum())
    b = tables.group_constant
    memory = work + slow * b * float(tables.lengths.sum()) / float(tables.rank_capacity.max())
    weight = float(speeds.sum())
    return max(memory / weight, fewest * b + work / weight)
