"""Static Megatron-style context parallelism as deployed.

One power-of-two CP size c is fixed for the whole run: the smallest that fits the longest sample
the workload allows (``max_length``, a training configuration parameter, not the longest sample of
the current batch). The domain is cut into floor(N / c) contiguous groups of c ranks (the data-
parallel replicas). As a data loader does, the batch is split in arrival order into equal-count
shards, one per replica; each replica packs its shard in arrival order into micro-batches of at
most c x C tokens (C the per-rank capacity), starting a new micro-batch when the next sample does
not fit. Nothing is balanced. The step runs as many micro-batches as the fullest replica needs;
each micro-batch lasts as long as its slowest replica.
"""

from __future__ import annotations

import math

from optimizer.costs.tables import CostTables
from optimizer.plan.records import Assignment


def deployed_degree(tables: CostTables, max_length: int) -> int | None:
    """The smallest power of two c with max_length <= c x capacity, or None when it exceeds the domain."""
    cap = float(tables.rank_capacity.min())
    c = 1
    while c * cap < max_length:
        c *= 2
    return c if c <= tables.n_ranks else None


def static_deployed(tables: CostTables, max_length: int) -> Assignment | None:
    """The as-deployed static plan (see the module docstring), or None when the CP size exceeds the domain."""
    c = deployed_degree(tables, max(max_length, int(tables.lengths.max())))
    if c is None:
        return None
    n_groups = tables.n_ranks // c
    cap = float(tables.rank_capacity.min()) * c
    n = tables.n_samples
    per_shard = math.ceil(n / n_groups)
    lengths = tables.lengths.tolist()
    packs_by_group: list[list[list[int]]] = []
    for k in range(n_groups):
        packs: list[list[int]] = []
        tokens = cap + 1.0  # forces a new pack for the first sample
        for i in range(k * per_shard, min(n, (k + 1) * per_shard)):
            if tokens + lengths[i] > cap:
                packs.append([])
                tokens = 0.0
            packs[-1].append(i)
            tokens += lengths[i]
        packs_by_group.append(packs)
    depth = max(len(p) for p in packs_by_group)
    groups: list[tuple[int, ...]] = [tuple(range(k * c, (k + 1) * c)) for k in range(n_groups)]
    micro_batches: list[list[tuple[list[int] | tuple[int, ...], list[int] | tuple[int, ...]]]] = [
        [(groups[k], packs_by_group[k][m]) for k in range(n_groups) if m < len(packs_by_group[k])] for m in range(depth)
    ]
    return Assignment.of(micro_batches)
