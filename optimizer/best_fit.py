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
def best_fit_long(order: np.ndarray, size_index: np.ndarray, times: np.ndarray, lengths: np.ndarray, sizes: np.ndarray,
                  capacity: float, slack: float, probes: int, out_group: np.ndarray, g_size: np.ndarray,
                  g_load: np.ndarray, g_tokens: np.ndarray) -> int:
    """Pack ``order``; ``out_group[k]`` gets the group of ``order[k]``. Returns the number of groups,
    whose size index, load and tokens are written to ``g_size``, ``g_load`` and ``g_tokens``."""
    n = order.shape[0]
    sorted_load = np.empty(n)
    sorted_group = np.empty(n, dtype=np.int64)
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
        # Last group whose load leaves room for ti (the first position with a larger load, minus one).
        room = slack - ti
        lo, hi = 0, count
        while lo < hi:
            mid = (lo + hi) >> 1
            if room < sorted_load[mid]:
                hi = mid
            else:
                lo = mid + 1
        k = lo - 1
        best = -1
        for _ in range(probes):
            if k < 0:
                break
            g = sorted_group[k]
            if g_tokens[g] + li <= limit:
                best = g
                for q in range(k, count - 1):
                    sorted_load[q] = sorted_load[q + 1]
                    sorted_group[q] = sorted_group[q + 1]
                count -= 1
                break
            k -= 1
        if best < 0:
            best = n_groups
            n_groups += 1
            g_size[best] = j
            g_load[best] = 0.0
            g_tokens[best] = 0.0
        g_load[best] += ti
        g_tokens[best] += li
        out_group[pos] = best
        # Insert (load, group) after every entry that is not larger.
        load = g_load[best]
        lo, hi = 0, count
        while lo < hi:
            mid = (lo + hi) >> 1
            if load < sorted_load[mid] or (load == sorted_load[mid] and best < sorted_group[mid]):
                hi = mid
            else:
                lo = mid + 1
        for q in range(count, lo, -1):
            sorted_load[q] = sorted_load[q - 1]
            sorted_group[q] = sorted_group[q - 1]
        sorted_load[lo] = load
        sorted_group[lo] = best
        count += 1
    return n_groups
