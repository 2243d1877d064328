"""Each sample's group size for a per-micro-batch target time, and the rank-seconds they add up to; compiled.

A sample takes the smallest allowed size that holds it in memory (``min_j``) and finishes it within
the target with the per-group constant ``b[j]`` of the size; when no size does, its fastest size (``fastest``).
``cost[i, j]`` is sample i's time on a well-placed group of the j-th allowed size.
"""

from __future__ import annotations

import numpy as np

from optimizer.jit import compiled


@compiled
def _choose(cost: np.ndarray, min_j: np.ndarray, fastest: np.ndarray, b: np.ndarray, target: float, i: int) -> int:
    j0 = min_j[i]
    if cost[i, j0] + b[j0] <= target:
        return j0
    for k in range(j0 + 1, cost.shape[1]):
        if cost[i, k] + b[k] <= target:
            return k
    return fastest[i]


@compiled
def choose_degrees(
    cost: np.ndarray, min_j: np.ndarray, fastest: np.ndarray, b: np.ndarray, target: float, out: np.ndarray
) -> None:
    """``out[i]``: the size index of sample i for ``target``."""
    for i in range(cost.shape[0]):
        out[i] = _choose(cost, min_j, fastest, b, target, i)


@compiled
def fluid_work(
    cost: np.ndarray, min_j: np.ndarray, fastest: np.ndarray, degrees: np.ndarray, b: np.ndarray, target: float
) -> float:
    """Rank-seconds of all samples on their sizes for ``target`` (size times time, summed)."""
    work = 0.0
    for i in range(cost.shape[0]):
        j = _choose(cost, min_j, fastest, b, target, i)
        work += degrees[j] * cost[i, j]
    return work


@compiled
def fastest_sizes(cost: np.ndarray, min_j: np.ndarray, out: np.ndarray) -> None:
    """``out[i]``: the size index, at least ``min_j[i]``, on which sample i is fastest (the first on ties)."""
    for i in range(cost.shape[0]):
        best = min_j[i]
        for k in range(best + 1, cost.shape[1]):
            if cost[i, k] < cost[i, best]:
                best = k
        out[i] = best
