"""One micro-batch for a handful of long samples: the best split into runs of the length order.

When a segment holds only a few samples (the longest of a batch), the packing heuristic's fluid
target says little: what matters is which samples share a group and how wide each group is. Here,
for k samples sorted longest first, every split of that order into consecutive runs (2^(k-1) of
them) is tried; each run is one group, and the group sizes are chosen to minimise the micro-batch's
time T: for a candidate T, each run takes the smallest allowed size that holds its tokens and
finishes within T, and T is feasible when the sizes add up to at most the domain. The least
feasible T over all candidate values (every run's time on every size) is found by bisection.
Groups up to a node's size are timed inside a node and laid out with
:func:`optimizer.heuristic.placement.place_groups`; the caller evaluates the plan with the real placement.
"""

from __future__ import annotations

import time

import numpy as np

from optimizer.costs.tables import CostTables
from optimizer.heuristic.placement import place_groups
from optimizer.jit import compiled
from optimizer.plan.records import Assignment

MAX_SAMPLES = 12
"""Most samples planned this way (2^(k-1) splits)."""


@compiled
def _run_sizes(
    prefix: np.ndarray,
    tokens: np.ndarray,
    degrees: np.ndarray,
    capacity: float,
    b: np.ndarray,
    n_ranks: int,
    mask: int,
    k: int,
    cand: np.ndarray,
    sizes_out: np.ndarray,
) -> float:
    """Least T for the runs cut by ``mask`` (bit p set: a cut after position p); sizes (indices) to ``sizes_out``."""
    n_deg = degrees.shape[0]
    starts = np.empty(k + 1, dtype=np.int64)
    n_runs = 0
    starts[0] = 0
    for p in range(k - 1):
        if (mask >> p) & 1:
            n_runs += 1
            starts[n_runs] = p + 1
    n_runs += 1
    starts[n_runs] = k
    n_cand = 0
    for g in range(n_runs):
        s, e = starts[g], starts[g + 1]
        for j in range(n_deg):
            if tokens[e] - tokens[s] <= capacity * degrees[j] * (1 + 1e-12):
                cand[n_cand] = b[j] + prefix[e, j] - prefix[s, j]
                n_cand += 1
    vals = np.sort(cand[:n_cand])
    lo, hi = 0, n_cand  # the first feasible value
    while lo < hi:
        mid = (lo + hi) >> 1
        t = vals[mid]
        used = 0
        ok = True
        for g in range(n_runs):
            s, e = starts[g], starts[g + 1]
            found = -1
            for j in range(n_deg):
                if (
                    tokens[e] - tokens[s] <= capacity * degrees[j] * (1 + 1e-12)
                    and b[j] + prefix[e, j] - prefix[s, j] <= t
                ):
                    found = j
                    break
            if found < 0:
                ok = False
                break
            used += degrees[found]
        if ok and used <= n_ranks:
            hi = mid
        else:
            lo = mid + 1
    if lo >= n_cand:
        return np.inf
    t = vals[lo]
    for g in range(n_runs):
        s, e = starts[g], starts[g + 1]
        for j in range(n_deg):
            if tokens[e] - tokens[s] <= capacity * degrees[j] * (1 + 1e-12) and b[j] + prefix[e, j] - prefix[s, j] <= t:
                sizes_out[g] = j
                break
    return t


@compiled
def best_split(
    prefix: np.ndarray,
    tokens: np.ndarray,
    degrees: np.ndarray,
    capacity: float,
    b: np.ndarray,
    n_ranks: int,
    k: int,
    sizes_out: np.ndarray,
    first: int,
    stop: int,
    best_t: float,
) -> tuple[int, float]:
    """The split (a mask in [``first``, ``stop``)) with a T below ``best_t`` and least, its run sizes in
    ``sizes_out``; (-1, ``best_t``) when none is better."""
    cand = np.empty(k * degrees.shape[0])
    sizes = np.empty(k, dtype=np.int64)
    best_mask = -1
    for mask in range(first, stop):
        t = _run_sizes(prefix, tokens, degrees, capacity, b, n_ranks, mask, k, cand, sizes)
        if t < best_t:
            best_t = t
            best_mask = mask
            sizes_out[:] = sizes
    return best_mask, best_t


MASKS_PER_CALL = 128
"""Splits tried between two looks at the clock (a few milliseconds at most on a 1,024-rank domain)."""


def few_samples_plan(tables: CostTables, deadline: float | None = None) -> Assignment | None:
    """The best one-micro-batch plan of the module docstring, or None (too many samples, or no split fits).

    With a ``deadline`` the splits are tried in blocks of MASKS_PER_CALL and the search stops at the
    deadline with the best split so far, or None when none fitted by then (the caller's other plans
    stand in)."""
    k = tables.n_samples
    if not 1 <= k <= MAX_SAMPLES:
        return None
    order = np.lexsort((np.arange(k), -tables.lengths))
    speed = float(tables.rank_speed.min())
    cost = tables.time_matrix(True, speed)[order]  # within a node up to its size, across nodes above
    prefix = np.zeros((k + 1, cost.shape[1]))
    np.cumsum(cost, axis=0, out=prefix[1:])
    tokens = np.zeros(k + 1)
    np.cumsum(tables.lengths[order].astype(np.float64), out=tokens[1:])
    sizes = np.empty(k, dtype=np.int64)
    found = np.empty(k, dtype=np.int64)
    mask, best_t = -1, np.inf
    for first in range(0, 1 << (k - 1), MASKS_PER_CALL):
        if first and deadline is not None and time.perf_counter() > deadline:
            break
        m, best_t = best_split(
            prefix,
            tokens,
            tables.degrees,
            float(tables.rank_capacity.min()),
            tables.placed_group_constants,
            tables.n_ranks,
            k,
            found,
            first,
            min(1 << (k - 1), first + MASKS_PER_CALL),
            best_t,
        )
        if m >= 0:
            mask, sizes[:] = m, found
    if mask < 0:
        return None
    runs: list[list[int]] = [[]]
    for p in range(k):
        runs[-1].append(int(order[p]))
        if p < k - 1 and (mask >> p) & 1:
            runs.append([])
    group_sizes = [int(tables.degrees[j]) for j in sizes[: len(runs)]]
    ranks, _ = place_groups(group_sizes, tables.node_ranges)
    if ranks is None:
        return None
    return Assignment.of([list(zip(ranks, runs, strict=True))])
