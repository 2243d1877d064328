"""Laying a plan's groups on aligned blocks (``degree_policy = "aligned"``).

Under the aligned policy every group smaller than the domain must be a block of d ranks starting at
a multiple of d (:func:`optimizer.problem.degrees.rank_set_problem`). The planners choose sizes from
the aligned ones (1, powers of two up to half the domain, the domain) and place groups for speed,
not alignment; this step re-lays each micro-batch that is not aligned yet: its groups largest first,
side by side from rank 0. Each group then starts at the sum of the sizes before it, all powers of
two at least its own, so at a multiple of its size; a group of the whole domain is alone in its
micro-batch. On a cluster of equal nodes whose size is a power of two the blocks up to a node stay
inside one, so no group's time grows; the plan's times are recomputed from the ranks in any case.
"""

from __future__ import annotations

from optimizer.costs.tables import CostTables
from optimizer.plan.records import Assignment, GroupAssignment


def _is_block(ranks: tuple[int, ...], n_ranks: int) -> bool:
    d = len(ranks)
    low = min(ranks)
    return d == 1 or d == n_ranks or (low % d == 0 and max(ranks) - low == d - 1)


def align_blocks(tables: CostTables, assignment: Assignment) -> Assignment:
    """``assignment`` with every micro-batch on aligned blocks (unchanged under other policies, and
    where a micro-batch is aligned already)."""
    if tables.problem.options.degree_policy != "aligned":
        return assignment
    n = tables.n_ranks
    out: list[tuple[GroupAssignment, ...]] = []
    changed = False
    for mb in assignment.micro_batches:
        if all(_is_block(ranks, n) for ranks, _ in mb):
            out.append(mb)
            continue
        changed = True
        start = 0
        groups: list[GroupAssignment] = []
        for ranks, samples in sorted(mb, key=lambda g: (-len(g[0]), min(g[0]))):
            groups.append((tuple(range(start, start + len(ranks))), samples))
            start += len(ranks)
        out.append(tuple(groups))
    return Assignment(tuple(out)) if changed else assignment
