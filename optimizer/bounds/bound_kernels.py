"""The lower bound's loops over the time table, compiled (see :mod:`optimizer.jit`).

Notation as in :mod:`optimizer.bounds.lower_bounds`: t[i, j] is sample i's best time on the j-th allowed size,
read on the fly from the intra- and inter-node matrices by
:func:`optimizer.costs.time_kernels.best_placement` (so the whole best-time table is never built);
``degrees[j]`` is that size, ``min_j[i]`` the first size on which i fits in memory (sizes below it
are not allowed for i), ``b[j]`` the least group constant of the j-th size (the profile's b, plus the
group's messages when the profile has ``comm.group_messages``). A sample finishes no earlier than
``b[j] + t[i, j]`` on that size.

:func:`sample_extremes` reads the matrices once. For the area bound only the samples whose
cheapest-area size would not finish within the starting bound matter while searching S; for each
of them :func:`area_frontiers` keeps the sizes on the time/area frontier for S at or above the
starting bound (sorted by finishing time b + t, each with a smaller area than every size that
finishes earlier), so that the cheapest area finishing within S is a binary search
(:func:`area_excess`), not a pass over all sizes.
"""

from __future__ import annotations

import numpy as np

from optimizer.costs.time_kernels import best_placement
from optimizer.jit import compiled


@compiled
def sample_extremes(
    intra: np.ndarray,
    inter: np.ndarray,
    fits_node: np.ndarray,
    degrees: np.ndarray,
    min_j: np.ndarray,
    b: np.ndarray,
    fastest: np.ndarray,
    best_area: np.ndarray,
    best_area_time: np.ndarray,
) -> None:
    """Per sample i, over its allowed sizes: ``fastest[i]`` the earliest finish b + t, ``best_area[i]``
    the least area d t (the first size attaining it) and ``best_area_time[i]`` the finish on that size."""
    n_degrees = degrees.shape[0]
    for i in range(min_j.shape[0]):
        low = np.inf
        area = np.inf
        area_time = np.inf
        for j in range(min_j[i], n_degrees):
            x = best_placement(intra[i, j], inter[i, j], fits_node[j])
            f = b[j] + x
            if f < low:
                low = f
            a = x * degrees[j]
            if a < area:
                area = a
                area_time = f
        fastest[i] = low
        best_area[i] = area
        best_area_time[i] = area_time


@compiled
def area_frontiers(
    intra: np.ndarray,
    inter: np.ndarray,
    fits_node: np.ndarray,
    degrees: np.ndarray,
    min_j: np.ndarray,
    rows: np.ndarray,
    b: np.ndarray,
    lo: float,
    start: np.ndarray,
    finish: np.ndarray,
    area: np.ndarray,
) -> None:
    """The frontier above ``lo`` of each sample ``rows[k]``: entries ``start[k]:start[k + 1]`` of
    ``finish`` (b + t, ascending) and ``area`` (strictly descending).

    The first entry is the size of least area among those finishing within ``lo`` (every sample
    has one when ``lo`` is at least the single-sample bound); the others are the sizes finishing
    later with a smaller area than every size finishing earlier. So the entries answer for every
    S >= ``lo``. ``start`` has ``len(rows) + 1`` entries and gets written; ``finish`` and ``area``
    need room for every allowed size of every row, plus one per row.
    """
    n_degrees = degrees.shape[0]
    t = np.empty(n_degrees)
    late = np.empty(n_degrees, dtype=np.int64)
    pos = 0
    for k in range(rows.shape[0]):
        i = rows[k]
        start[k] = pos
        least = np.inf
        first = np.inf
        for j in range(min_j[i], n_degrees):
            t[j] = best_placement(intra[i, j], inter[i, j], fits_node[j])
            f = b[j] + t[j]
            a = t[j] * degrees[j]
            if f <= lo and a < least:
                least = a
                first = f
        finish[pos] = first
        area[pos] = least
        pos += 1
        # The later sizes that beat it, by finishing time (few: insertion sort).
        m = 0
        for j in range(min_j[i], n_degrees):
            f = b[j] + t[j]
            if f > lo and t[j] * degrees[j] < least:
                q = m
                while q > 0 and b[late[q - 1]] + t[late[q - 1]] > f:
                    late[q] = late[q - 1]
                    q -= 1
                late[q] = j
                m += 1
        for q in range(m):
            j = late[q]
            a = t[j] * degrees[j]
            if a < least:
                least = a
                finish[pos] = b[j] + t[j]
                area[pos] = a
                pos += 1
    start[rows.shape[0]] = pos


@compiled
def area_excess(s: float, start: np.ndarray, finish: np.ndarray, area: np.ndarray) -> float:
    """Sum over the frontier samples of the least area among sizes finishing within ``s``
    (``s`` at least the frontiers' ``lo``); infinity if some sample finishes within ``s`` on no size."""
    total = 0.0
    for k in range(start.shape[0] - 1):
        lo = start[k]
        hi = start[k + 1]
        # The last entry with finish <= s: area falls along the frontier, so it is the least.
        while lo < hi:
            mid = (lo + hi) >> 1
            if finish[mid] <= s:
                lo = mid + 1
            else:
                hi = mid
        if lo == start[k]:
            return np.inf
        total += area[lo - 1]
    return total


@compiled
def area_search(
    lo: float,
    base: float,
    memory: float,
    start: np.ndarray,
    finish: np.ndarray,
    area: np.ndarray,
    n_ranks: float,
    rel_tol: float,
) -> float:
    """Bisection for the smallest S >= ``lo`` with base + excess(S) + memory - N S <= 0, to
    ``rel_tol`` (``base``: the fixed samples' areas, ``memory``: the memory term; see
    :func:`optimizer.bounds.lower_bounds.area_bound`)."""
    if base + area_excess(lo, start, finish, area) + memory - n_ranks * lo <= 0:
        return lo
    hi = lo * 2
    while base + area_excess(hi, start, finish, area) + memory - n_ranks * hi > 0:
        hi *= 2
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if base + area_excess(mid, start, finish, area) + memory - n_ranks * mid > 0:
            lo = mid
        else:
            hi = mid
    return lo
