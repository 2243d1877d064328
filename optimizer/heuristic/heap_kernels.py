"""Binary min-heaps stored in flat arrays, for compiled loops.

Many heaps share one pool: heap ``h`` lives in ``key1[base:base + size]`` (with ``key2`` and
``ident`` alongside) and its caller keeps ``base`` and ``size``. Entries order by (key1, key2,
ident), lexicographically, as tuples do in :mod:`heapq`; with distinct idents the smallest entry is
unique, so pops come out in the same order as from a :mod:`heapq` of the same tuples.
"""

from __future__ import annotations

import numpy as np

from optimizer.jit import compiled


@compiled
def _less(a1: float, a2: float, ai: int, b1: float, b2: float, bi: int) -> bool:
    if a1 != b1:
        return a1 < b1
    if a2 != b2:
        return a2 < b2
    return ai < bi


@compiled
def push(
    key1: np.ndarray, key2: np.ndarray, ident: np.ndarray, base: int, size: int, k1: float, k2: float, i: int
) -> int:
    """Add (k1, k2, i) to the heap at ``base`` holding ``size`` entries; returns the new size."""
    pos = size
    while pos > 0:
        parent = (pos - 1) >> 1
        p = base + parent
        if _less(k1, k2, i, key1[p], key2[p], ident[p]):
            key1[base + pos], key2[base + pos], ident[base + pos] = key1[p], key2[p], ident[p]
            pos = parent
        else:
            break
    key1[base + pos], key2[base + pos], ident[base + pos] = k1, k2, i
    return size + 1


@compiled
def pop(key1: np.ndarray, key2: np.ndarray, ident: np.ndarray, base: int, size: int) -> tuple[float, float, int, int]:
    """Remove the smallest entry of a non-empty heap; returns (k1, k2, ident, new size)."""
    top1, top2, top_i = key1[base], key2[base], ident[base]
    size -= 1
    if size > 0:
        k1, k2, i = key1[base + size], key2[base + size], ident[base + size]
        pos = 0
        while True:
            child = 2 * pos + 1
            if child >= size:
                break
            c = base + child
            r = c + 1
            if child + 1 < size and _less(key1[r], key2[r], ident[r], key1[c], key2[c], ident[c]):
                child += 1
                c = r
            if _less(key1[c], key2[c], ident[c], k1, k2, i):
                key1[base + pos], key2[base + pos], ident[base + pos] = key1[c], key2[c], ident[c]
                pos = child
            else:
                break
        key1[base + pos], key2[base + pos], ident[base + pos] = k1, k2, i
    return top1, top2, top_i, size
