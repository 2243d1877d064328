"""The memory-first packing's placement loop, compiled (see :mod:`optimizer.jit`).

Samples come longest first. Each joins the group with the least memory room that still holds it
(best fit; the lowest group on ties), or opens a group of its memory-minimal size in a micro-batch:
the next untouched one while ``spread`` asks for it or no opened micro-batch has the free ranks,
else the opened one with the most free ranks (the first on ties). When that micro-batch lacks the
ranks, the group needing the fewest extra ranks of its own micro-batch grows to hold the sample.

The groups are kept sorted by (room, group) in blocks of at most BLOCK entries (each block sorted,
the blocks in order, a full block split in two): finding the best fit, taking a group out and
putting it back cost O(log groups + BLOCK) each, where one sorted array would shift thousands of
entries per sample on large batches. The opened micro-batches sit in a max-heap by free ranks whose
stale entries (a micro-batch's free ranks have fallen since) are skipped.
"""

from __future__ import annotations

import numpy as np

from optimizer.heuristic.heap_kernels import pop, push
from optimizer.jit import compiled

BLOCK = 128
"""Most entries of one block of the sorted groups."""


@compiled
def _before(room_a: float, group_a: int, room_b: float, group_b: int) -> bool:
    """Whether (room_a, group_a) sorts before (room_b, group_b)."""
    return room_a < room_b or (room_a == room_b and group_a < group_b)


@compiled
def _first_not_before(
    rooms: np.ndarray,
    groups: np.ndarray,
    size: np.ndarray,
    blocks: np.ndarray,
    count: int,
    b: int,
    room: float,
    group: int,
) -> int:
    """Binary search for (room, group): with ``b`` < 0 over the last entries of the first ``count``
    blocks in order (the place of the first block whose last entry is not before it; ``count`` when
    every one is), else within block ``b`` (its first entry not before it)."""
    lo, hi = 0, count
    while lo < hi:
        mid = (lo + hi) >> 1
        if b < 0:
            at, k = blocks[mid], size[blocks[mid]] - 1
        else:
            at, k = b, mid
        if _before(rooms[at, k], groups[at, k], room, group):
            lo = mid + 1
        else:
            hi = mid
    return lo


@compiled
def _block_of(
    rooms: np.ndarray, groups: np.ndarray, size: np.ndarray, blocks: np.ndarray, n_blocks: int, room: float, group: int
) -> int:
    """The place (in ``blocks``) of the first block whose last entry is not before (room, group);
    ``n_blocks`` when every block's is."""
    return _first_not_before(rooms, groups, size, blocks, n_blocks, -1, room, group)


@compiled
def _index_in(
    rooms: np.ndarray, groups: np.ndarray, size: np.ndarray, blocks: np.ndarray, b: int, room: float, group: int
) -> int:
    """The first entry of block b not before (room, group)."""
    return _first_not_before(rooms, groups, size, blocks, size[b], b, room, group)


@compiled
def _remove(
    rooms: np.ndarray, groups: np.ndarray, size: np.ndarray, blocks: np.ndarray, n_blocks: int, place: int, k: int
) -> int:
    """Remove entry k of the block at ``place``; returns the number of blocks (an emptied block
    leaves the order, unless it is the only one)."""
    b = blocks[place]
    for q in range(k, size[b] - 1):
        rooms[b, q] = rooms[b, q + 1]
        groups[b, q] = groups[b, q + 1]
    size[b] -= 1
    if size[b] == 0 and n_blocks > 1:
        for q in range(place, n_blocks - 1):
            blocks[q] = blocks[q + 1]
        blocks[n_blocks - 1] = b  # kept past the end, for reuse
        n_blocks -= 1
    return n_blocks


@compiled
def _insert(
    rooms: np.ndarray,
    groups: np.ndarray,
    size: np.ndarray,
    blocks: np.ndarray,
    n_blocks: int,
    n_made: int,
    room: float,
    group: int,
) -> tuple[int, int]:
    """Insert (room, group); returns the numbers of blocks in order and of blocks ever made."""
    place = min(_block_of(rooms, groups, size, blocks, n_blocks, room, group), n_blocks - 1)
    b = blocks[place]
    k = _index_in(rooms, groups, size, blocks, b, room, group)
    for q in range(size[b], k, -1):
        rooms[b, q] = rooms[b, q - 1]
        groups[b, q] = groups[b, q - 1]
    rooms[b, k] = room
    groups[b, k] = group
    size[b] += 1
    if size[b] == rooms.shape[1]:  # full: its upper half moves to a new block after it
        if n_blocks < n_made:
            fresh = blocks[n_blocks]  # an emptied block
        else:
            fresh = n_made
            n_made += 1
        half = size[b] // 2
        for q in range(half, size[b]):
            rooms[fresh, q - half] = rooms[b, q]
            groups[fresh, q - half] = groups[b, q]
        size[fresh] = size[b] - half
        size[b] = half
        for q in range(n_blocks, place + 1, -1):
            blocks[q] = blocks[q - 1]
        blocks[place + 1] = fresh
        n_blocks += 1
    return n_blocks, n_made


@compiled
def memory_first(
    order: np.ndarray,
    lengths: np.ndarray,
    min_j: np.ndarray,
    degrees: np.ndarray,
    capacity: float,
    n_ranks: int,
    n_micro_batches: int,
    spread: bool,
    out_group: np.ndarray,
    g_size: np.ndarray,
    g_micro_batch: np.ndarray,
) -> tuple[int, int]:
    """Place ``order`` (sample indices, longest first); ``min_j[i]`` is sample i's memory-minimal
    size index into ``degrees`` at ``capacity`` tokens per rank.

    ``out_group[i]`` receives sample i's group; ``g_size`` and ``g_micro_batch`` each group's final
    size index and micro-batch. Returns (groups, micro-batches opened), or (-1, opened) when a
    sample finds neither a group nor the ranks for one.
    """
    n = order.shape[0]
    n_degrees = degrees.shape[0]
    free = np.full(n_micro_batches, n_ranks, dtype=np.int64)
    fresh = 0  # micro-batches from here on have all their ranks free
    h1 = np.empty(n + 1)
    h2 = np.zeros(n + 1)
    hid = np.empty(n + 1, dtype=np.int64)
    heap = 0
    rooms = np.empty(n)
    # The groups by (room, group), in sorted blocks: block blocks[q] holds size[blocks[q]] entries.
    block_rooms = np.empty((n // (BLOCK // 2) + 2, BLOCK))
    block_groups = np.empty((n // (BLOCK // 2) + 2, BLOCK), dtype=np.int64)
    size = np.zeros(block_rooms.shape[0], dtype=np.int64)
    blocks = np.arange(block_rooms.shape[0])
    n_blocks, n_made = 1, 1
    entries = 0
    n_groups = 0
    for pos in range(n):
        i = order[pos]
        li = lengths[i]
        # The first group whose room holds li (before every entry (li, g): (li, -1)) is the best fit.
        place = _block_of(block_rooms, block_groups, size, blocks, n_blocks, li, -1) if entries else n_blocks
        if place < n_blocks:
            k = _index_in(block_rooms, block_groups, size, blocks, blocks[place], li, -1)
            best = block_groups[blocks[place], k]
            n_blocks = _remove(block_rooms, block_groups, size, blocks, n_blocks, place, k)
            entries -= 1
        else:
            j = min_j[i]
            d = degrees[j]
            while heap > 0 and -h1[0] != free[hid[0]]:
                _, _, _, heap = pop(h1, h2, hid, 0, heap)
            if spread or heap == 0 or free[hid[0]] < d:
                micro_batch = fresh if fresh < n_micro_batches else hid[0]
            else:
                micro_batch = hid[0]
            if micro_batch == fresh:
                fresh += 1
            if free[micro_batch] >= d:
                best = n_groups
                n_groups += 1
                rooms[best] = capacity * d
                g_size[best] = j
                g_micro_batch[best] = micro_batch
            else:
                # The group (the first on ties) needing the fewest extra free ranks of its micro-batch to hold li.
                best = -1
                best_extra = 0
                grown = -1
                for g in range(n_groups):
                    dg = degrees[g_size[g]]
                    need = np.ceil((capacity * dg - rooms[g] + li) / capacity - 1e-9)
                    a, b = 0, n_degrees
                    while a < b:
                        mid = (a + b) >> 1
                        if degrees[mid] < need:
                            a = mid + 1
                        else:
                            b = mid
                    jg = max(g_size[g], a)
                    if jg < n_degrees:
                        extra = degrees[jg] - dg
                        if extra <= free[g_micro_batch[g]] and (best < 0 or extra < best_extra):
                            best, best_extra, grown = g, extra, jg
                if best < 0:
                    return -1, fresh
                place = _block_of(block_rooms, block_groups, size, blocks, n_blocks, rooms[best], best)
                k = _index_in(block_rooms, block_groups, size, blocks, blocks[place], rooms[best], best)
                n_blocks = _remove(block_rooms, block_groups, size, blocks, n_blocks, place, k)
                entries -= 1
                micro_batch = g_micro_batch[best]
                d = degrees[grown] - degrees[g_size[best]]
                rooms[best] += capacity * d
                g_size[best] = grown
            free[micro_batch] -= d
            heap = push(h1, h2, hid, 0, heap, -float(free[micro_batch]), 0.0, micro_batch)
        out_group[i] = best
        rooms[best] -= li
        n_blocks, n_made = _insert(block_rooms, block_groups, size, blocks, n_blocks, n_made, rooms[best], best)
        entries += 1
    return n_groups, fresh
