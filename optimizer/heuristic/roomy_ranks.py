"""A plan on the roomiest nodes, for clusters whose GPU types hold different token counts.

The heuristic plans a mixed cluster as if every rank had the smallest capacity (and the slowest
speed), so a sample that only the roomier GPUs can hold makes it give up although the batch fits:
a group's tokens are split evenly over its ranks, and a group made of roomy ranks alone holds more.
Here the cluster is cut down to the nodes whose capacity is at least a level, for each capacity
level above the smallest (most ranks first), and the heuristic plans the batch there; the first
level that packs gives the plan, its ranks mapped back to the whole cluster's. The other ranks stay
idle in that plan (an exact backend that follows may still move work onto them). A second plan
splits the batch: the samples that need roomy ranks are planned there in micro-batches of their own,
the others on the whole cluster after them; the faster of the two is returned.

Every allowed group of the cut cluster is a group of the whole one (same nodes, same links, sizes
that the whole domain allows too), so the mapped plan is a plan of the problem; the planner verifies
it like every other. Clusters with pipeline stages are left alone (the domain's ranks of a stage
are not whole nodes there).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from optimizer.costs.tables import CostTables
from optimizer.errors import PlannerError
from optimizer.heuristic.strategies import heuristic_plan
from optimizer.plan.evaluate import assignment_step_time
from optimizer.plan.records import Assignment
from optimizer.problem.batch import Batch
from optimizer.problem.problem import Problem


def roomy_plan(tables: CostTables, deadline: float | None) -> tuple[Assignment, str] | None:
    """(plan, what was done) on the roomiest nodes that hold the batch, or None when no cut helps."""
    problem = tables.problem
    cluster = problem.cluster
    if cluster.pipeline_parallel != 1:
        return None
    profile = problem.cost_profile
    node_capacity = [profile.capacity_for(n.gpu.name) for n in cluster.nodes]
    levels = sorted(set(node_capacity))[1:]  # the smallest level is the whole cluster, already tried
    rank_node = np.asarray(cluster.rank_node)
    for level in levels:
        kept = [i for i, c in enumerate(node_capacity) if c >= level]
        ranks = np.flatnonzero(np.isin(rank_node, kept))
        names = "/".join(sorted({cluster.nodes[i].gpu.name for i in kept}))
        sub = _cut(problem, kept)
        try:
            whole = _mapped(heuristic_plan(CostTables.build(sub), deadline=deadline), ranks)
        except PlannerError:
            continue
        best, how = (
            whole,
            (
                f"planned on the {len(ranks)} ranks of {names} nodes (at least {level:.0f} tokens per rank); "
                "the others idle"
            ),
        )
        split = _split_plan(tables, sub, ranks, deadline)
        if split is not None and assignment_step_time(tables, split) < assignment_step_time(tables, whole):
            best, how = (
                split,
                (
                    f"the samples that need {names} ranks planned on those {len(ranks)} ranks, "
                    "in micro-batches of their own; the others on the whole cluster"
                ),
            )
        return best, how
    return None


def _cut(problem: Problem, kept: list[int]) -> Problem:
    """The problem on the nodes ``kept`` alone (same batch, profile and options)."""
    cluster = problem.cluster
    sub = replace(
        problem,
        cluster=replace(cluster, nodes=tuple(cluster.nodes[i] for i in kept)),
        profile=problem.cost_profile,
        existing_groups=(),
    )
    if problem.options.max_degree is not None and problem.options.max_degree > sub.domain_size:
        sub = sub.with_options(max_degree=sub.domain_size)
    return sub


def _mapped(plan: Assignment, ranks: np.ndarray, samples: list[int] | None = None) -> Assignment:
    """``plan`` of a cut problem in the whole problem's ranks (and sample indices, when ``samples`` maps them)."""

    def sample(i: int) -> int:
        return i if samples is None else samples[i]

    return Assignment.of(
        [[(ranks[list(r)].tolist(), [sample(i) for i in s]) for r, s in mb] for mb in plan.micro_batches]
    )


def _split_plan(tables: CostTables, sub: Problem, ranks: np.ndarray, deadline: float | None) -> Assignment | None:
    """Roomy-needing samples on the cut cluster, the rest on the whole one, micro-batches one after the other."""
    problem = tables.problem
    smallest = float(tables.rank_capacity.min())
    fits_small = max(int(d) * smallest for d in tables.degrees)
    big = [i for i, n in enumerate(tables.lengths.tolist()) if n > fits_small]
    small = [i for i, n in enumerate(tables.lengths.tolist()) if n <= fits_small]
    if not big or not small:
        return None
    samples = problem.batch.samples
    try:
        head = heuristic_plan(
            CostTables.build(replace(sub, batch=Batch(tuple(samples[i] for i in big)))), deadline=deadline
        )
        rest = heuristic_plan(
            CostTables.build(replace(problem, batch=Batch(tuple(samples[i] for i in small)), existing_groups=())),
            deadline=deadline,
        )
    except PlannerError:
        return None
    first = _mapped(head, ranks, big)
    second = _mapped(rest, np.arange(tables.n_ranks), small)
    return Assignment(first.micro_batches + second.micro_batches)
