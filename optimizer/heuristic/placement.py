"""Placing groups of given sizes onto ranks, node by node, and spreading groups over micro-batches.

Groups are placed largest first. A group no larger than a node goes to the node with the fewest free
ranks that still hold it (best fit, lowest node index on ties), on contiguous ranks, so it uses the
intra-node links. A group larger than a node takes whole free nodes in a row plus part of the next.
Only when no node has room does a group spill over several nodes, taken from the nodes with the most
free ranks first (it then pays inter-node bandwidth, which the planner sees in the group's time).
Ranks left over are returned so the caller can use them. The loops are compiled (:mod:`optimizer.jit`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from optimizer.jit import compiled


@compiled
def _whole_node_run(free_start: np.ndarray, node_start: np.ndarray, node_end: np.ndarray, d: int) -> int:
    """First node starting a run of consecutive nodes whose free ranks add up to d, all but the last
    wholly free; -1 if none."""
    n_nodes = node_start.shape[0]
    for start in range(n_nodes):
        if free_start[start] != node_start[start]:
            continue
        got = 0
        n = start
        while n < n_nodes:
            whole = free_start[n] == node_start[n]
            got += node_end[n] - free_start[n]
            if got >= d:
                return start
            if not whole:
                break
            n += 1
    return -1


@compiled
def place_micro_batch(
    sizes: np.ndarray,
    node_start: np.ndarray,
    node_end: np.ndarray,
    offsets: np.ndarray,
    ranks_out: np.ndarray,
    free_out: np.ndarray,
) -> int:
    """Place groups of ``sizes`` on one micro-batch of the domain.

    Group k's ranks go to ``ranks_out[offsets[k]:offsets[k + 1]]`` (ascending); the free ranks left
    go to the front of ``free_out``. Returns how many ranks are free, or -1 if the groups do not fit.
    """
    n_nodes = node_start.shape[0]
    total = 0
    node_size = 0
    for n in range(n_nodes):
        total += node_end[n] - node_start[n]
        node_size = max(node_size, node_end[n] - node_start[n])
    if sizes.sum() > total:
        return -1
    free_start = node_start.copy()
    spill = np.empty(sizes.shape[0], dtype=np.int64)
    n_spill = 0
    for k in np.argsort(-sizes, kind="mergesort"):
        d = sizes[k]
        out = offsets[k]
        if d <= node_size:
            best = -1
            best_free = node_size + 1
            for n in range(n_nodes):
                f = node_end[n] - free_start[n]
                if d <= f < best_free:
                    best, best_free = n, f
            if best < 0:
                spill[n_spill] = k
                n_spill += 1
                continue
            for q in range(d):
                ranks_out[out + q] = free_start[best] + q
            free_start[best] += d
            continue
        n = _whole_node_run(free_start, node_start, node_end, d)
        if n < 0:
            spill[n_spill] = k
            n_spill += 1
            continue
        got = 0
        while got < d:
            take = min(d - got, node_end[n] - free_start[n])
            for q in range(take):
                ranks_out[out + got + q] = free_start[n] + q
            got += take
            free_start[n] += take
            n += 1
    for s in range(n_spill):
        k = spill[s]
        d = sizes[k]
        out = offsets[k]
        got = 0
        for n in np.argsort(free_start - node_end, kind="mergesort"):
            take = min(d - got, node_end[n] - free_start[n])
            for q in range(take):
                ranks_out[out + got + q] = free_start[n] + q
            got += take
            free_start[n] += take
            if got == d:
                break
        ranks_out[out : out + d] = np.sort(ranks_out[out : out + d])
    n_free = 0
    for n in range(n_nodes):
        for r in range(free_start[n], node_end[n]):
            free_out[n_free] = r
            n_free += 1
    return n_free


@compiled
def spread_over_micro_batches(
    sizes: np.ndarray, order: np.ndarray, n_micro_batches: int, n_ranks: int, micro_batch_out: np.ndarray
) -> bool:
    """Each group, in ``order``, to the micro-batch with the fewest used ranks that still has room (lowest
    micro-batch on ties). False if some group has no room."""
    used = np.zeros(n_micro_batches, dtype=np.int64)
    for k in order:
        d = sizes[k]
        best = -1
        for m in range(n_micro_batches):
            if used[m] + d <= n_ranks and (best < 0 or used[m] < used[best]):
                best = m
        if best < 0:
            return False
        used[best] += d
        micro_batch_out[k] = best
    return True


def place_groups(
    sizes: Sequence[int], node_ranges: Sequence[tuple[int, int]]
) -> tuple[list[tuple[int, ...]] | None, list[int]]:
    """Ranks for each group (same order as ``sizes``) and the free ranks left, or (None, []) if they do not fit."""
    size_arr = np.asarray(sizes, dtype=np.int64).reshape(-1)
    node_start = np.fromiter((a for a, _ in node_ranges), dtype=np.int64, count=len(node_ranges))
    node_end = np.fromiter((b for _, b in node_ranges), dtype=np.int64, count=len(node_ranges))
    offsets = np.zeros(size_arr.shape[0] + 1, dtype=np.int64)
    np.cumsum(size_arr, out=offsets[1:])
    ranks = np.empty(int(offsets[-1]), dtype=np.int64)
    free = np.empty(int((node_end - node_start).sum()), dtype=np.int64)
    n_free = place_micro_batch(size_arr, node_start, node_end, offsets, ranks, free)
    if n_free < 0:
        return None, []
    flat = ranks.tolist()
    bounds = offsets.tolist()
    return [tuple(flat[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)], free[:n_free].tolist()
