"""Static layouts, planned under the same cost model, for comparison.

*Static at its best*: one power-of-two context-parallel size c for the whole batch, the domain cut
into floor(N / c) contiguous groups of c ranks, the samples balanced over the groups longest first
(each to the least-loaded group with memory room) and spread over as many micro-batches as memory
requires; the best c and micro-batch count for this batch are kept. This is what a well-tuned
static Megatron or DeepSpeed mesh achieves on the batch.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from optimizer.costs import CostTables
from optimizer.plan import Assignment, StaticBaseline


def static_assignment(tables: CostTables, c: int, micro_batches: int) -> Assignment | None:
    """Balance the batch over ``micro_batches`` x floor(N/c) static groups of size c, or None if memory forbids."""
    n_groups = tables.n_ranks // c
    groups = [tuple(range(k * c, (k + 1) * c)) for k in range(n_groups)]
    spans = [tables.group_span(g) for g in groups]
    j = tables.degree_index.get(c)
    if j is None:
        return None
    times = [tables.time_matrix(intra, speed)[:, j] for intra, speed, _ in spans]
    limit = [cap * c for _, _, cap in spans]
    order = np.argsort(-times[0], kind="stable")
    lengths = tables.lengths
    bins = [(0.0, m, k) for m in range(micro_batches) for k in range(n_groups)]
    heapq.heapify(bins)
    tokens: dict[tuple[int, int], float] = {}
    members: dict[tuple[int, int], list[int]] = {}
    for i in order.tolist():
        li = float(lengths[i])
        stash = []
        while bins and tokens.get((bins[0][1], bins[0][2]), 0.0) + li > limit[bins[0][2]]:
            stash.append(heapq.heappop(bins))
        if not bins:
            return None
        load, m, k = heapq.heappop(bins)
        members.setdefault((m, k), []).append(i)
        tokens[(m, k)] = tokens.get((m, k), 0.0) + li
        heapq.heappush(bins, (load + float(times[k][i]), m, k))
        for item in stash:
            heapq.heappush(bins, item)
    mbs = [[(groups[k], members.get((m, k), [])) for k in range(n_groups)] for m in range(micro_batches)]
    return Assignment.of(mbs)


def best_static(tables: CostTables) -> tuple[StaticBaseline, Assignment] | None:
    """The best static power-of-two layout for this batch (see the module docstring).

    Sizes are tried in order of their fluid estimate (rank-seconds over N plus the per-micro-batch
    constant); a size whose estimate is already above the best layout found cannot win and is skipped.
    """
    from optimizer.evaluate import assignment_step_time

    n = tables.n_ranks
    cap = float(tables.rank_capacity.min())
    total = float(tables.lengths.sum())
    longest = int(tables.lengths.max())
    most = tables.problem.options.max_micro_batches
    best_time = tables.best_time
    candidates = []
    c = 1
    while c <= n:
        if longest <= cap * c and c in tables.degree_index:
            n_groups = n // c
            least = max(1, math.ceil(total / (cap * c * n_groups) - 1e-12))
            if least <= most:
                work = float(best_time[:, tables.degree_index[c]].sum())
                estimate = work / n_groups + least * tables.group_constant
                candidates.append((estimate, c, least))
        c *= 2
    best: tuple[StaticBaseline, Assignment] | None = None
    for estimate, c, least in sorted(candidates):
        if best is not None and estimate >= best[0].predicted_step_time_s:
            break
        for mb in range(least, min(most, least + 1) + 1):
            a = static_assignment(tables, c, mb)
            if a is None:
                continue
            step = assignment_step_time(tables, a)
            if best is None or step < best[0].predicted_step_time_s:
                best = (StaticBaseline(degree=c, micro_batches=len(a.micro_batches), predicted_step_time_s=step), a)
    return best
