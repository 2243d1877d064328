"""Moving a plan onto the job's existing communicators (``options.group_reuse``), as the last step of planning.

The engine remaps groups (:func:`optimizer.plan.group_reuse.adapt`). Under ``prefer`` with a price on
new communicators (``options.new_group_cost_s``), groups of sizes the job lacks stay new; a plan
restricted to the existing groups may then cost less in all (step time plus group cost), so it is
planned too, under the request's own deadline, and the cheaper one is kept.
"""

from __future__ import annotations

from optimizer.costs.tables import CostTables
from optimizer.errors import InfeasibleError
from optimizer.heuristic.strategies import heuristic_plan
from optimizer.plan.group_reuse import adapt, objective
from optimizer.plan.group_sets import active, new_communicators
from optimizer.plan.records import Assignment


def reuse_groups(tables: CostTables, assignment: Assignment, deadline: float | None) -> Assignment:
    """``assignment`` on the existing groups as the options ask (unchanged when reuse is off)."""
    problem = tables.problem
    if not active(problem):
        return assignment
    result = adapt(tables, assignment)
    if problem.options.group_reuse == "only" or problem.options.new_group_cost_s <= 0:
        return result
    if not new_communicators(problem, (r for mb in result.micro_batches for r, _ in mb)):
        return result
    alternative = existing_only(tables, deadline)
    if alternative is not None and objective(tables, alternative) < objective(tables, result):
        return alternative
    return result


def existing_only(tables: CostTables, deadline: float | None) -> Assignment | None:
    """The heuristic's plan restricted to the existing groups (None when they cannot hold the batch)."""
    restricted = tables.problem.with_options(group_reuse="only")
    try:
        sub = CostTables.build(restricted)
        return adapt(sub, heuristic_plan(sub, deadline=deadline))
    except InfeasibleError:
        return None
