"""The planners a benchmark compares, behind one call: problem in, assignment out.

Every planner starts from the same :class:`~optimizer.problem.Problem` and builds its own cost
tables, so its planning time covers the same work. The answers are evaluated and verified by the
runner with the engine's code, never by the planner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from bench.baselines import flexsp_milp, megatron_dcp, static_deployed
from bench.workloads import Workload
from optimizer.baselines import best_static
from optimizer.costs import CostTables
from optimizer.plan import Assignment, Plan
from optimizer.problem import Problem


@dataclass
class Outcome:
    """A planner's answer: the assignment (None when it has no plan) and what it says about it."""

    assignment: Assignment | None
    note: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


Planner = Callable[[Problem, Workload], Outcome]


def plan_assignment(plan: Plan, problem: Problem) -> Assignment:
    """The assignment behind a plan (sample ids back to indices)."""
    index = problem.batch.index
    return Assignment(tuple(tuple((g.ranks, tuple(index[s] for s in g.samples)) for g in mb.groups) for mb in plan.micro_batches))


def _static_deployed(problem: Problem, workload: Workload) -> Outcome:
    a = static_deployed(CostTables.build(problem), workload.max_length)
    return Outcome(a, None if a else f"the CP size for {workload.max_length} tokens exceeds the domain")


def _static_best(problem: Problem, workload: Workload) -> Outcome:
    found = best_static(CostTables.build(problem))
    if found is None:
        return Outcome(None, "no static power-of-two layout fits")
    return Outcome(found[1], details={"degree": found[0].degree, "micro_batches": found[0].micro_batches})


def _megatron(problem: Problem, workload: Workload) -> Outcome:
    a = megatron_dcp(CostTables.build(problem))
    return Outcome(a, None if a else "a sample needs more than the domain, or more micro-batches than allowed")


def _flexsp(problem: Problem, workload: Workload) -> Outcome:
    opts = problem.options
    r = flexsp_milp(CostTables.build(problem), opts.time_budget_ms / 1000.0, workers=opts.solver_workers)
    return Outcome(r.assignment, r.message, r.to_json())


def _dhp(backend: str) -> Planner:
    def run(problem: Problem, workload: Workload) -> Outcome:
        from optimizer.planner import plan

        p = plan(replace(problem, options=replace(problem.options, backend=backend)))  # as users call it: static layout as a floor
        s = p.solver
        details = {"backend": s.backend, "status": s.status, "phases": s.details.get("phases", {}), "chosen": s.details.get("chosen")}
        return Outcome(plan_assignment(p, problem), s.fallback_reason, details)

    return run


PLANNERS: dict[str, Planner] = {
    "static-deployed": _static_deployed,
    "static-best": _static_best,
    "megatron-dcp": _megatron,
    "flexsp-milp": _flexsp,
    "dhp-heuristic": _dhp("heuristic"),
    "dhp-auto": _dhp("auto"),
}
"""All planners, in report order. ``dhp-auto`` is the heuristic then an exact backend when one is installed."""

LABELS = {
    "static-deployed": "static as deployed",
    "static-best": "static at its best",
    "megatron-dcp": "Megatron dynamic-CP greedy",
    "flexsp-milp": "FlexSP-style MILP",
    "dhp-heuristic": "dhp heuristic",
    "dhp-auto": "dhp heuristic + solver",
}


def default_planners() -> list[str]:
    """Every planner; ``dhp-auto`` only when an exact backend is installed (else it equals the heuristic),
    ``flexsp-milp`` only when OR-Tools is (``pip install 'dhp-planner[bench]'``)."""
    names = list(PLANNERS)
    try:
        from solver_models import available_backends

        have = available_backends()
    except Exception:  # noqa: BLE001 - a broken optional backend must not stop a benchmark
        have = []
    if not have:
        names.remove("dhp-auto")
    try:
        import ortools  # noqa: F401 - the FlexSP-style MILP needs CP-SAT
    except ModuleNotFoundError:
        names.remove("flexsp-milp")
    return names
