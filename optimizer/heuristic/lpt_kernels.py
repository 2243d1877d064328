"""Longest-processing-time placement of the short samples, compiled (see :mod:`optimizer.jit`).

Groups fall into classes (same size, same placement, same speed: a sample takes the same time on
every group of a class). Each sample, in the given order, goes to the group where it would finish
earliest, memory permitting: per class only the least-loaded group with room matters, so every
class keeps a min-heap of its groups by (load, group). A group without memory room for the current
sample waits in a second heap, by room, until a sample that fits comes (samples arrive longest in
tokens first, so most waiting groups never return).

Classes of groups larger than one rank drop out, every eighth sample, once their least-loaded
group is loaded up to ``slack``: from then on only the single-rank groups can finish a sample
earlier in practice. Ties break on the class index, then the group index.
"""

from __future__ import annotations

import numpy as np

from optimizer.heuristic.heap_kernels import pop, push
from optimizer.jit import compiled


@compiled
def lpt_place(
    order: np.ndarray,
    lengths: np.ndarray,
    times: np.ndarray,
    group_class: np.ndarray,
    load: np.ndarray,
    tokens: np.ndarray,
    class_limit: np.ndarray,
    class_unit: np.ndarray,
    slack: float,
    out_group: np.ndarray,
) -> bool:
    """Place ``order`` (sample indices); ``times[i, c]`` is sample i's time on class c.

    ``load`` and ``tokens`` (per group) are updated in place; ``out_group[k]`` receives the group of
    ``order[k]``. Returns False when some sample fits no group's memory.
    """
    n_classes = times.shape[1]
    n_groups = group_class.shape[0]
    count = np.zeros(n_classes, dtype=np.int64)
    for g in range(n_groups):
        count[group_class[g]] += 1
    base = np.zeros(n_classes, dtype=np.int64)
    for c in range(1, n_classes):
        base[c] = base[c - 1] + count[c - 1]
    h1 = np.empty(n_groups)
    h2 = np.zeros(n_groups)
    hid = np.empty(n_groups, dtype=np.int64)
    hsize = np.zeros(n_classes, dtype=np.int64)
    w1 = np.empty(n_groups)
    w2 = np.empty(n_groups)
    wid = np.empty(n_groups, dtype=np.int64)
    wsize = np.zeros(n_classes, dtype=np.int64)
    for g in range(n_groups):
        c = group_class[g]
        hsize[c] = push(h1, h2, hid, base[c], hsize[c], load[g], 0.0, g)
    active = np.arange(n_classes)
    n_active = n_classes
    has_unit = False
    for c in range(n_classes):
        if class_unit[c]:
            has_unit = True
    for pos in range(order.shape[0]):
        i = order[pos]
        li = lengths[i]
        if has_unit and (pos + 1) % 8 == 0 and n_active > 1:
            kept = 0
            for a in range(n_active):
                c = active[a]
                if class_unit[c] or (hsize[c] > 0 and h1[base[c]] < slack):
                    active[kept] = c
                    kept += 1
            n_active = kept
        best = -1
        best_finish = np.inf
        for a in range(n_active):
            c = active[a]
            b = base[c]
            limit = class_limit[c]
            while wsize[c] > 0 and -w1[b] >= li:
                _, ld, g, wsize[c] = pop(w1, w2, wid, b, wsize[c])
                hsize[c] = push(h1, h2, hid, b, hsize[c], ld, 0.0, g)
            while hsize[c] > 0 and tokens[hid[b]] + li > limit:
                ld, _, g, hsize[c] = pop(h1, h2, hid, b, hsize[c])
                wsize[c] = push(w1, w2, wid, b, wsize[c], tokens[g] - limit, ld, g)
            if hsize[c] > 0:
                finish = h1[b] + times[i, c]
                if finish < best_finish:
                    best_finish = finish
                    best = c
        if best < 0:
            return False
        b = base[best]
        ld, _, g, hsize[best] = pop(h1, h2, hid, b, hsize[best])
        ld += times[i, best]
        load[g] = ld
        tokens[g] += li
        out_group[pos] = g
        hsize[best] = push(h1, h2, hid, b, hsize[best], ld, 0.0, g)
    return True
