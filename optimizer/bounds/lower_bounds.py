"""Lower bounds on the step time, valid for every plan of the problem.

Notation: N ranks, b the group constant, b_d >= b the least constant of a group of size d (b plus
its messages' latency when the profile has ``comm.group_messages``; b_d = b otherwise), t_i(d) the
best time of sample i on a group of size d (intra-node where d fits a node, fastest GPU), m_i the
smallest size on which i fits in memory, C the largest per-rank capacity, S the step time (the
micro-batches; the profile's per-step constant is added to the plan and its bound alike by
:func:`optimizer.plan.evaluate.build_plan`).

1. Single sample: S >= min_{d >= m_i} (b_d + t_i(d)) for every i.
2. Rank-time (area): a group of size d busy for T_m in micro-batch m occupies d T_m rank-seconds,
   at least d (b + sum of its samples' t_i(d)). Summing over groups and micro-batches, and using
   T_m <= S:  N S >= sum_i e_i(S) + b * (sum_i L_i) / C, where
   e_i(S) = min { d t_i(d) : d >= m_i, b_d + t_i(d) <= S } (the sample must finish within S), and
   sum_i L_i / C is the least total group size all micro-batches together need for memory.
   The left side grows with S and the right side shrinks, so the smallest S that satisfies the
   inequality is found by bisection; every S below it is impossible.
3. Micro-batches: every micro-batch lasts at least b plus its slowest group's work, and there are at
   least M = ceil(sum_i L_i / (capacity of all ranks)) of them. In micro-batch m the slowest group
   works at least (sum of the areas of m's samples) / N, and a sample of m finishes within
   T_m <= S - (M - 1) b. So S >= (M - 1) b + S' with N S' >= N b + sum_i e_i(S') (e_i as in 2,
   evaluated at S'). It is the stronger bound when the per-micro-batch constant b is large.
4. Mixed GPU types: rank-seconds weighted by each rank's speed (:mod:`optimizer.bounds.speed_bound`).
5. The micro-batch of a slow sample: its ranks wait for it unless memory lets other samples fill
   them, or it runs on a larger, costlier group (:mod:`optimizer.bounds.long_sample`).
6. A few micro-batches at the fewest: how the slowest samples split among them, each micro-batch's
   memory capping the work it can take off the others (:mod:`optimizer.bounds.few_micro_batches`).
The solver backends add LP-relaxation bounds on top of these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from optimizer.bounds.bound_kernels import area_frontiers, area_search, sample_extremes
from optimizer.bounds.few_micro_batches import few_micro_batch_bound
from optimizer.bounds.long_sample import long_sample_bound
from optimizer.bounds.speed_bound import speed_weighted_bound
from optimizer.costs.tables import CostTables
from optimizer.problem.degrees import group_capacities


def _extremes(tables: CostTables) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sample over its allowed sizes: the earliest finish b_d + t_i(d), the least area d t_i(d),
    and the finish on that size."""
    n = tables.n_samples
    fastest, best_area, best_area_time = np.empty(n), np.empty(n), np.empty(n)
    sample_extremes(
        *tables.best_placements(),
        tables.degrees.astype(np.float64),
        tables.min_degree_index,
        tables.best_group_constants,
        fastest,
        best_area,
        best_area_time,
    )
    return fastest, best_area, best_area_time


def single_sample_bound(tables: CostTables, fastest: np.ndarray | None = None) -> float:
    """Bound 1 (see the module docstring); ``fastest`` is each sample's earliest finish where known."""
    if fastest is None:
        fastest = _extremes(tables)[0]
    return float(fastest.max())


@dataclass(frozen=True)
class _Frontiers:
    """What the area searches read (:func:`optimizer.bounds.bound_kernels.area_frontiers`): the search's
    floor ``lo``, the fixed samples' areas ``base`` and the other samples' frontiers above ``lo``. Valid
    for every search that starts at ``lo``; the area and micro-batch bounds both do."""

    lo: float
    base: float
    start: np.ndarray
    finish: np.ndarray
    area: np.ndarray


def _frontiers(tables: CostTables, floor: float, extremes: tuple[np.ndarray, np.ndarray, np.ndarray]) -> _Frontiers:
    fastest, best_area, best_area_time = extremes
    lo = float(max(floor, single_sample_bound(tables, fastest)))
    # Samples whose cheapest-area size already finishes within lo never change: fold them in once.
    fixed = best_area_time <= lo
    base = float(best_area[fixed].sum())
    rows = np.flatnonzero(~fixed)
    min_j = tables.min_degree_index
    room = int((len(tables.degrees) - min_j[rows]).sum()) + len(rows)
    start = np.empty(len(rows) + 1, dtype=np.int64)
    finish, area = np.empty(room), np.empty(room)
    area_frontiers(
        *tables.best_placements(),
        tables.degrees.astype(np.float64),
        min_j,
        rows,
        tables.best_group_constants,
        lo,
        start,
        finish,
        area,
    )
    return _Frontiers(lo, base, start, finish, area)


def _area_search(
    tables: CostTables,
    memory: float,
    floor: float,
    rel_tol: float,
    extremes: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    frontiers: _Frontiers | None = None,
) -> float:
    """Smallest S >= floor with sum_i e_i(S) + ``memory`` <= N S, by bisection to ``rel_tol``
    (``extremes``: :func:`_extremes` of the tables when already computed; ``frontiers``: the
    frontiers when already computed from the same floor)."""
    if frontiers is None:
        frontiers = _frontiers(tables, floor, _extremes(tables) if extremes is None else extremes)
    f = frontiers
    return float(area_search(f.lo, f.base, memory, f.start, f.finish, f.area, float(tables.n_ranks), rel_tol))


def area_bound(
    tables: CostTables,
    floor: float = 0.0,
    rel_tol: float = 1e-5,
    extremes: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    frontiers: _Frontiers | None = None,
) -> float:
    """Smallest S with sum_i e_i(S) + b sum L / C <= N S (bound 2 of the module docstring)."""
    memory_ranks = float(tables.lengths.sum()) / float(tables.rank_capacity.max())
    return _area_search(tables, tables.group_constant * memory_ranks, floor, rel_tol, extremes, frontiers)


def fewest_micro_batches(tables: CostTables) -> int:
    """The least micro-batch count memory allows: the batch's tokens over what all ranks hold at once."""
    per_mb = float(tables.rank_capacity.sum())
    return max(1, math.ceil(float(tables.lengths.sum()) / per_mb * (1 - 1e-12)))


def micro_batch_bound(
    tables: CostTables,
    rel_tol: float = 1e-5,
    extremes: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    frontiers: _Frontiers | None = None,
) -> float:
    """Bound 3 of the module docstring: (M - 1) b + S', S' the smallest with sum_i e_i(S') + N b <= N S'."""
    m = fewest_micro_batches(tables)
    b = tables.group_constant
    return (m - 1) * b + _area_search(tables, tables.n_ranks * b, 0.0, rel_tol, extremes, frontiers)


def bound_parts(tables: CostTables, splits: bool = True) -> dict[str, float]:
    """Every lower bound of the module docstring by name (the largest is the problem's bound); without
    bound 6 when ``splits`` is false (see :func:`lower_bound`)."""
    tables = tables.for_bounds
    extremes = _extremes(tables)
    frontiers = _frontiers(tables, 0.0, extremes)  # both searches start at the single-sample bound
    parts = {"area": area_bound(tables, extremes=extremes, frontiers=frontiers)}
    if tables.group_constant > 0:  # without a per-micro-batch constant bound 3 is bound 2 without its memory term
        parts["micro_batches"] = micro_batch_bound(tables, extremes=extremes, frontiers=frontiers)
    fewest = fewest_micro_batches(tables)
    slow = long_sample_bound(tables, fewest, extremes[0], extremes[1])
    if slow is not None:
        parts["long_sample"] = slow
    split = few_micro_batch_bound(tables, fewest, extremes[0], extremes[1]) if splits else None
    if split is not None:
        parts["few_micro_batches"] = split
    speed = speed_weighted_bound(tables, fewest)  # mixed GPU types only
    if speed is not None:
        parts["speed"] = speed
    return parts


def quick_bound_parts(tables: CostTables) -> dict[str, float]:
    """The cheapest valid bound by name: bound 1 (single sample), one pass over the time matrices;
    :func:`bound_parts` is never below it (its area searches start from it)."""
    return {"single_sample": single_sample_bound(tables.for_bounds)}


def lower_bound(tables: CostTables, splits: bool = True) -> float:
    """The largest part. ``splits=False`` leaves out bound 6 (about a millisecond a call): the heuristic's
    estimates of the parts of a batch it plans (hundreds of calls on one batch) read the others; over the
    180 batches of the bench grid their plans are the same with it or without it, and bound 6 took up to
    92 ms of a heuristic's second there."""
    return max(bound_parts(tables, splits).values())


def memory_proof(tables: CostTables) -> bool:
    """Whether the batch provably cannot fit: more tokens than every rank of every allowed micro-batch
    holds, or a sample longer than any allowed group holds (d times its d-th roomiest rank's capacity:
    a group's tokens are split evenly over its ranks)."""
    limit = min(tables.problem.options.micro_batch_limit, tables.n_samples)
    capacity = tables.rank_capacity
    largest = float(group_capacities(capacity, tables.degrees).max())
    return bool(
        tables.lengths.sum() > limit * capacity.sum() * (1 + 1e-9) or tables.lengths.max() > largest * (1 + 1e-9)
    )
