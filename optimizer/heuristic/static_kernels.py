"""The static layout's balancing, compiled (see :mod:`optimizer.jit`).

``micro_batches`` x G static groups form bins; bin ``m * G + k`` is group k in micro-batch m. Each
sample, in the given order, goes to the bin whose group has memory room for it and would finish it
first: its load plus its class's group constant plus the sample's time on its class, ties to the
lower bin. Where the layout's groups are of one class (one GPU type, every group within a node or
every one spanning nodes) that is the least-loaded bin; on GPUs of several speeds a fast group
takes more work than a slow one (LPT on related machines). Per class, two heaps find the class's
candidate: the bins in play by (load, bin), and the bins set aside (too full for some sample
already placed) by their room, roomiest first. Before a sample is placed, every set-aside bin with
room for it comes back into play; then bins without room for it are set aside from the top of the
first heap until the top has room. A bin moves only when a sample longer than its room comes (or
after one is placed), so on a batch in roughly decreasing length order the work is
O(n classes log bins), where popping every full bin for every sample would be O(n bins) on
memory-tight batches. A bin that even the shortest sample still to come would not fit is dropped:
no later sample can go there.

:func:`sort_ties_by_index` turns a quick (unstable) sort into the stable one, and
:func:`members_by_bin` lists each bin's samples in placement order.
"""

from __future__ import annotations

import numpy as np

from optimizer.heuristic.heap_kernels import pop, push
from optimizer.jit import compiled


@compiled
def balance_static(
    order: np.ndarray,
    lengths: np.ndarray,
    times: np.ndarray,
    group_class: np.ndarray,
    limit: np.ndarray,
    micro_batches: int,
    group_constant: np.ndarray,
    out_bin: np.ndarray,
    load: np.ndarray,
    mb_time: np.ndarray,
    rest_min: np.ndarray,
) -> bool:
    """Place ``order`` (sample indices); ``times[c, i]`` is sample i's time on a group of class c,
    ``group_constant[c]`` the group constant of class c, ``group_class[k]`` and ``limit[k]`` group k's
    class and token limit; ``rest_min[p]`` is the shortest length among ``order[p:]``.

    ``out_bin[i]`` receives sample i's bin, ``load[bin]`` the bin's summed time (in placement
    order), ``mb_time[m]`` the slowest non-empty group of micro-batch m (group constant included;
    0 for an empty micro-batch). Returns False when some sample fits no group's memory.
    """
    n_groups = group_class.shape[0]
    n_bins = micro_batches * n_groups
    n_classes = times.shape[0]
    # Per class, two heaps in one segment of the arrays (class c's starts at base[c]): in play by
    # (load, bin); set aside by (-room, bin), the roomiest on top.
    per_class = np.zeros(n_classes, dtype=np.int64)
    for k in range(n_groups):
        per_class[group_class[k]] += micro_batches
    base = np.zeros(n_classes, dtype=np.int64)
    for c in range(1, n_classes):
        base[c] = base[c - 1] + per_class[c - 1]
    h1 = np.empty(n_bins)
    h2 = np.zeros(n_bins)
    hid = np.empty(n_bins, dtype=np.int64)
    w1 = np.empty(n_bins)
    w2 = np.zeros(n_bins)
    wid = np.empty(n_bins, dtype=np.int64)
    size = np.zeros(n_classes, dtype=np.int64)
    waiting = np.zeros(n_classes, dtype=np.int64)
    tokens = np.zeros(n_bins)
    count = np.zeros(n_bins, dtype=np.int64)
    for g in range(n_bins):
        load[g] = 0.0
        c = group_class[g % n_groups]
        size[c] = push(h1, h2, hid, base[c], size[c], 0.0, 0.0, g)
    for pos in range(order.shape[0]):
        i = order[pos]
        li = float(lengths[i])
        best_c = -1
        best_finish = 0.0
        for c in range(n_classes):
            b = base[c]
            while waiting[c] > 0 and tokens[wid[b]] + li <= limit[wid[b] % n_groups]:
                _, _, g, waiting[c] = pop(w1, w2, wid, b, waiting[c])
                size[c] = push(h1, h2, hid, b, size[c], load[g], 0.0, g)
            while size[c] > 0 and tokens[hid[b]] + li > limit[hid[b] % n_groups]:
                _, _, g, size[c] = pop(h1, h2, hid, b, size[c])
                # It cannot take this sample; it may take a later one (rest_min[pos] <= li: those are the later ones).
                if tokens[g] + rest_min[pos] <= limit[g % n_groups]:
                    waiting[c] = push(w1, w2, wid, b, waiting[c], tokens[g] - limit[g % n_groups], 0.0, g)
            if size[c] > 0:
                finish = h1[b] + group_constant[c] + times[c, i]
                if best_c < 0 or finish < best_finish or (finish == best_finish and hid[b] < hid[base[best_c]]):
                    best_c, best_finish = c, finish
        if best_c < 0:
            return False
        b = base[best_c]
        ld, _, g, size[best_c] = pop(h1, h2, hid, b, size[best_c])
        out_bin[i] = g
        tokens[g] += li
        count[g] += 1
        ld += times[best_c, i]
        load[g] = ld
        if pos + 1 < order.shape[0] and tokens[g] + rest_min[pos + 1] <= limit[g % n_groups]:
            size[best_c] = push(h1, h2, hid, b, size[best_c], ld, 0.0, g)
    for m in range(micro_batches):
        slowest = 0.0
        for k in range(n_groups):
            g = m * n_groups + k
            if count[g] > 0:
                t = load[g] + group_constant[group_class[k]]
                if t > slowest:
                    slowest = t
        mb_time[m] = slowest
    return True


@compiled
def sort_ties_by_index(keys: np.ndarray, order: np.ndarray) -> None:
    """``order`` sorts ``keys``; within every run of equal keys, put the indices in ascending order
    (what a stable sort gives)."""
    n = order.shape[0]
    s = 0
    while s < n:
        e = s + 1
        while e < n and keys[order[e]] == keys[order[s]]:
            e += 1
        if e - s > 16:
            order[s:e] = np.sort(order[s:e])
        else:
            for q in range(s + 1, e):
                x = order[q]
                r = q
                while r > s and order[r - 1] > x:
                    order[r] = order[r - 1]
                    r -= 1
                order[r] = x
        s = e


@compiled
def members_by_bin(
    order: np.ndarray, sample_bin: np.ndarray, n_bins: int, members: np.ndarray, end: np.ndarray
) -> None:
    """The samples of ``order`` grouped by bin, each bin's in the order of ``order``: bin b holds
    ``members[end[b - 1]:end[b]]`` (from 0 for b = 0)."""
    end[:] = 0
    for pos in range(order.shape[0]):
        end[sample_bin[order[pos]]] += 1
    total = 0
    for b in range(n_bins):
        total += end[b]
        end[b] = total - end[b]
    for pos in range(order.shape[0]):
        i = order[pos]
        b = sample_bin[i]
        members[end[b]] = i
        end[b] += 1
