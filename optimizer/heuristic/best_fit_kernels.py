"""Best-fit-decreasing packing of the long samples into groups of their size, compiled.

Samples come sorted by group size (largest first), then time (longest first). Per size, the open
groups are kept sorted by (load, group). A sample goes to the fullest open group whose load still
leaves room for its time within the target (``slack``), trying ``probes`` groups downwards from
there for memory room; if none has room it opens a new group. Sizes never come back once passed,
so one sorted list serves all sizes in turn.
"""

from __future__ import annotations

import numpy as np

from optimizer.jit import compiled


@compiled
def best_fit_long(
    order: np.ndarray,
    size_index: np.ndarray,
    times: np.ndarray,
    lengths: np.ndarray,
    sizes: np.ndarray,
    capacity: float,
    slack: np.ndarray,
    probes: int,
    out_group: np.ndarray,
    g_size: np.ndarray,
    g_load: np.ndarray,
    g_tokens: np.ndarray,
) -> int:
    """Pack ``order``; ``out_group[k]`` gets the group of ``order[k]``. Returns the number of groups,
    whose size index, load and tokens are written to ``g_size``, ``g_load`` and ``g_tokens``."""
    n = order.shape[0]
    # Open groups of the current size in DESCENDING (load, group) order: new groups (the lightest,
    # as samples come longest first) land near the end, and a group that gains load moves only a
    # few places to the front, so the array shifts stay short.
    by_load = np.empty(n)
    by_group = np.empty(n, dtype=np.int64)
    count = 0
    current = -1
    n_groups = 0
    for pos in range(n):
        i = order[pos]
        j = size_index[i]
        if j != current:
            current = j
            count = 0
        ti = times[i]
        li = lengths[i]
        limit = capacity * sizes[j]
        # The fullest group whose load still leaves room for ti: the first position with load <= slack - ti.
        room = slack[j] - ti
        lo, hi = 0, count
        while lo < hi:
            mid = (lo + hi) >> 1
            if by_load[mid] <= room:
                hi = mid
            else:
                lo = mid + 1
        k = lo
        best = -1
        for _ in range(probes):
            if k >= count:
                break
            g = by_group[k]
            if g_tokens[g] + li <= limit:
                best = g
                break
            k += 1
        if best < 0:
            best = n_groups
            n_groups += 1
            g_size[best] = j
            g_load[best] = 0.0
            g_tokens[best] = 0.0
            k = count  # a new entry: it is inserted as if appended, then moved forward
            count += 1
        g_load[best] += ti
        g_tokens[best] += li
        out_group[pos] = best
        # Move the entry at k forward past every entry smaller than (load, best).
        load = g_load[best]
        while k > 0 and (by_load[k - 1] < load or (by_load[k - 1] == load and by_group[k - 1] < best)):
            by_load[k] = by_load[k - 1]
            by_group[k] = by_group[k - 1]
            k -= 1
        by_load[k] = load
        by_group[k] = best
    return n_groups
