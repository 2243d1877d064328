"""Placing groups of given sizes onto ranks, node by node.

Groups are placed largest first. A group no larger than a node goes to the node with the fewest free
ranks that still hold it (best fit), on contiguous ranks, so it uses the intra-node links. A group
larger than a node takes whole free nodes in a row plus part of the next. Only when no node has
room does a group spill over several nodes (it then pays inter-node bandwidth, which the planner
sees in the group's time). Ranks left over are returned so the caller can use them.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def place_groups(sizes: Sequence[int], node_ranges: Sequence[tuple[int, int]]) -> tuple[list[tuple[int, ...]] | None, list[int]]:
    """Ranks for each group (same order as ``sizes``) and the free ranks left, or (None, []) if they do not fit."""
    free_start = [a for a, _ in node_ranges]
    ends = [b for _, b in node_ranges]
    total = sum(b - a for a, b in node_ranges)
    if sum(sizes) > total:
        return None, []
    placed: list[tuple[int, ...] | None] = [None] * len(sizes)
    order = sorted(range(len(sizes)), key=lambda k: -sizes[k])
    node_size = max(b - a for a, b in node_ranges)
    # Nodes bucketed by their free rank count, each bucket a min-heap of node indices, so that
    # best fit (fewest free ranks that still hold the group, lowest index first) costs O(node size).
    buckets: list[list[int]] = [[] for _ in range(node_size + 1)]
    for n in range(len(free_start)):
        buckets[ends[n] - free_start[n]].append(n)
    stale: set[tuple[int, int]] = set()

    def take_best_fit(d: int) -> int:
        for f in range(d, node_size + 1):
            heap = buckets[f]
            while heap:
                n = heapq.heappop(heap)
                if (n, f) in stale:
                    stale.discard((n, f))
                    continue
                return n
        return -1

    def refile(n: int, old: int) -> None:
        new = ends[n] - free_start[n]
        if new != old:
            heapq.heappush(buckets[new], n)

    spill: list[int] = []
    for k in order:
        d = sizes[k]
        if d <= node_size:
            n = take_best_fit(d)
            if n >= 0:
                a = free_start[n]
                placed[k] = tuple(range(a, a + d))
                free_start[n] += d
                heapq.heappush(buckets[ends[n] - free_start[n]], n)
                continue
            spill.append(k)
            continue
        # Larger than a node: a run of wholly free nodes, then the rest from the next node.
        run = _whole_node_run(free_start, node_ranges, d)
        if run is None:
            spill.append(k)
            continue
        ranks: list[int] = []
        n = run
        while len(ranks) < d:
            old = ends[n] - free_start[n]
            take = min(d - len(ranks), old)
            ranks.extend(range(free_start[n], free_start[n] + take))
            free_start[n] += take
            if take:
                stale.add((n, old))
                heapq.heappush(buckets[ends[n] - free_start[n]], n)
            n += 1
        placed[k] = tuple(ranks)
    for k in spill:
        d = sizes[k]
        ranks = []
        # Take from the nodes with most free ranks first to touch as few nodes as possible.
        for n in sorted(range(len(free_start)), key=lambda n: -(ends[n] - free_start[n])):
            take = min(d - len(ranks), ends[n] - free_start[n])
            ranks.extend(range(free_start[n], free_start[n] + take))
            free_start[n] += take
            if len(ranks) == d:
                break
        placed[k] = tuple(sorted(ranks))
    free = [r for n in range(len(free_start)) for r in range(free_start[n], ends[n])]
    return [p for p in placed if p is not None], free


def _whole_node_run(free_start: list[int], node_ranges: Sequence[tuple[int, int]], d: int) -> int | None:
    """First node index starting a run of consecutive nodes whose free ranks add up to d, all but the last wholly free."""
    for start in range(len(node_ranges)):
        if free_start[start] != node_ranges[start][0]:
            continue
        got = 0
        n = start
        while n < len(node_ranges):
            a, b = node_ranges[n]
            whole = free_start[n] == a
            got += b - free_start[n]
            if got >= d:
                return start
            if not whole:
                break
            n += 1
    return None
