"""A Megatron-Core dynamic-CP-style greedy (hybrid context parallelism), from its public description.

Per micro-batch, over the samples not yet planned, longest first:

1. a sample's CP size is the next power of two of (length / per-rank capacity), at least 1;
2. while the domain has free ranks for that size, the sample opens a new group of that size;
   otherwise it joins the least-loaded group of the same size that still has memory room
   (balancing within groups of equal size, longest first); when none has room it is left over;
3. idle GPUs are filled by doubling the smallest group (among equal sizes, the most loaded one)
   while the free ranks allow;
4. groups get contiguous rank blocks, largest first (power-of-two blocks stay aligned, so groups
   that fit a node stay inside one);
5. the leftovers go to the next micro-batch.

The domain must be a power of two: on other sizes the greedy uses the largest power of two that
fits, as Megatron requires. The load of a group is the cost model's time of its samples.
"""

from __future__ import annotations

import heapq
import math

from optimizer.costs.tables import CostTables
from optimizer.plan.plan import Assignment


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def megatron_dcp(tables: CostTables) -> Assignment | None:
    """The greedy's plan (see the module docstring), or None when a sample needs more than the domain."""
    domain = 1 << (tables.n_ranks.bit_length() - 1)
    cap = float(tables.rank_capacity.min())
    index = tables.degree_index
    times = tables.best_time
    lengths = tables.lengths.tolist()
    need = [_next_pow2(math.ceil(L / cap)) for L in lengths]
    if max(need) > domain or any(s not in index for s in set(need)):
        return None
    remaining = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    limit = tables.problem.options.micro_batch_limit
    micro_batches: list[list[tuple[list[int] | tuple[int, ...], list[int] | tuple[int, ...]]]] = []
    while remaining:
        if len(micro_batches) >= limit:
            return None
        free = domain
        sizes: list[int] = []
        members: list[list[int]] = []
        tokens: list[float] = []
        loads: list[float] = []
        heaps: dict[int, list[tuple[float, int]]] = {}
        leftovers = []
        shortest = lengths[remaining[-1]]
        for i in remaining:
            s = need[i]
            t = float(times[i, index[s]])
            if s <= free:
                heapq.heappush(heaps.setdefault(s, []), (t, len(sizes)))
                sizes.append(s)
                members.append([i])
                tokens.append(lengths[i])
                loads.append(t)
                free -= s
                continue
            heap = heaps.get(s, [])
            stash = []
            while heap and tokens[heap[0][1]] + lengths[i] > cap * s:
                item = heapq.heappop(heap)
                if tokens[item[1]] + shortest <= cap * s:  # full groups are dropped for good
                    stash.append(item)
            if heap:
                load, g = heapq.heappop(heap)
                members[g].append(i)
                tokens[g] += lengths[i]
                loads[g] = load + t
                heapq.heappush(heap, (loads[g], g))
            else:
                leftovers.append(i)
            for item in stash:
                heapq.heappush(heap, item)
        while True:
            grow = [g for g in range(len(sizes)) if sizes[g] <= free and 2 * sizes[g] in index]
            if not grow:
                break
            g = min(grow, key=lambda g: (sizes[g], -loads[g]))
            free -= sizes[g]
            sizes[g] *= 2
            loads[g] = float(times[members[g], index[sizes[g]]].sum())
        start = 0
        groups: list[tuple[list[int] | tuple[int, ...], list[int] | tuple[int, ...]]] = []
        for g in sorted(range(len(sizes)), key=lambda g: -sizes[g]):
            groups.append((tuple(range(start, start + sizes[g])), members[g]))
            start += sizes[g]
        micro_batches.append(groups)
        remaining = leftovers
    return Assignment.of(micro_batches)
