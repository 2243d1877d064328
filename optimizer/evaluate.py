"""Turn an assignment into a plan, with times from the cost tables."""

from __future__ import annotations

from optimizer.communicators import new_communicators, reporting
from optimizer.costs import CostTables
from optimizer.plan import Assignment, GroupPlan, MicroBatchPlan, Plan, SolverStats, StaticBaseline


def assignment_step_time(tables: CostTables, assignment: Assignment) -> float:
    """Sum over micro-batches of the slowest group's predicted time."""
    times = iter(tables.group_times([g for mb in assignment.micro_batches for g in mb]))
    return sum(max((next(times) for _ in mb), default=0.0) for mb in assignment.micro_batches)


def build_plan(
    tables: CostTables,
    assignment: Assignment,
    solver: SolverStats,
    lower_bound_s: float,
    static: StaticBaseline | None = None,
) -> Plan:
    samples = tables.problem.batch.samples
    ordered = [sorted(mb, key=lambda g: g[0][0]) for mb in assignment.micro_batches]
    times = iter(tables.group_times([g for mb in ordered for g in mb]))
    mbs = []
    step = 0.0
    for mb in ordered:
        groups = []
        for ranks, idx in mb:
            t = next(times)
            intra, _, _ = tables.group_span(ranks)
            groups.append(GroupPlan(ranks=ranks, samples=tuple(samples[i].id for i in idx), lengths=tuple(samples[i].length for i in idx), predicted_time_s=t, intra_node=intra))
        plan_mb = MicroBatchPlan(tuple(groups))
        step += plan_mb.predicted_time_s
        mbs.append(plan_mb)
    problem = tables.problem
    new = None
    if reporting(problem):
        new = tuple(new_communicators(problem, (g.ranks for mb in mbs for g in mb.groups)))
    return Plan(
        new_communicators=new,
        group_setup_s=problem.options.new_group_cost_s * len(new) if new else 0.0,
        micro_batches=tuple(mbs),
        predicted_step_time_s=step,
        lower_bound_s=lower_bound_s,
        scheme=tables.profile.scheme,
        domain_size=tables.n_ranks,
        solver=solver,
        static_baseline=static,
    )
