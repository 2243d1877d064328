"""The static layout's balancing, compiled (see :mod:`optimizer.jit`).

``micro_batches`` x G static groups form bins; bin ``m * G + k`` is group k in micro-batch m. The
bins sit in one min-heap by (load, bin), which orders as (load, micro-batch, group) does. Each
sample, in the given order, goes to the least-loaded bin whose group has memory room for it: bins
without room are taken off the heap while the sample is placed, then put back, unless even the
shortest sample still to come would not fit them (then no later sample can go there, and leaving
them out spares every later sample the same pops on memory-tight batches).

:func:`sort_ties_by_index` turns a quick (unstable) sort into the stable one, and
:func:`members_by_bin` lists each bin's samples in placement order.
"""

from __future__ import annotations

import numpy as np

from optimizer.heuristic.heap_kernels import pop, push
from optimizer.jit import compiled


@compiled
def balance_static(order: np.ndarray, lengths: np.ndarray, times: np.ndarray, group_class: np.ndarray, limit: np.ndarray,
                   micro_batches: int, group_constant: np.ndarray, out_bin: np.ndarray, load: np.ndarray, mb_time: np.ndarray,
                   rest_min: np.ndarray) -> bool:
    """Place ``order`` (sample indices); ``times[c, i]`` is sample i's time on a group of class c,
    ``group_constant[c]`` the group constant of class c, ``group_class[k]`` and ``limit[k]`` group k's
    class and token limit; ``rest_min[p]`` is the shortest length among ``order[p:]``.

    ``out_bin[i]`` receives sample i's bin, ``load[bin]`` the bin's summed time (in placement
    order), ``mb_time[m]`` the slowest non-empty group of micro-batch m (group constant included;
    0 for an empty micro-batch). Returns False when some sample fits no group's memory.
    """
    n_groups = group_class.shape[0]
    n_bins = micro_batches * n_groups
    h1 = np.empty(n_bins)
    h2 = np.zeros(n_bins)
    hid = np.empty(n_bins, dtype=np.int64)
    s1 = np.empty(n_bins)
    sid = np.empty(n_bins, dtype=np.int64)
    tokens = np.zeros(n_bins)
    count = np.zeros(n_bins, dtype=np.int64)
    size = 0
    for g in range(n_bins):
        load[g] = 0.0
        size = push(h1, h2, hid, 0, size, 0.0, 0.0, g)
    for pos in range(order.shape[0]):
        i = order[pos]
        li = float(lengths[i])
        stashed = 0
        while size > 0 and tokens[hid[0]] + li > limit[hid[0] % n_groups]:
            s1[stashed], _, sid[stashed], size = pop(h1, h2, hid, 0, size)
            stashed += 1
        if size == 0:
            return False
        ld, _, g, size = pop(h1, h2, hid, 0, size)
        out_bin[i] = g
        tokens[g] += li
        count[g] += 1
        ld += times[group_class[g % n_groups], i]
        load[g] = ld
        if pos + 1 < order.shape[0]:
            shortest = rest_min[pos + 1]
            if tokens[g] + shortest <= limit[g % n_groups]:
                size = push(h1, h2, hid, 0, size, ld, 0.0, g)
            for q in range(stashed):
                if tokens[sid[q]] + shortest <= limit[sid[q] % n_groups]:
                    size = push(h1, h2, hid, 0, size, s1[q], 0.0, sid[q])
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
def members_by_bin(order: np.ndarray, sample_bin: np.ndarray, n_bins: int, members: np.ndarray, end: np.ndarray) -> None:
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
