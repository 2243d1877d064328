"""The planners a benchmark compares, behind one call: problem in, assignment out.

Every planner starts from the same :class:`~optimizer.problem.problem.Problem` and builds its own cost
tables, so its planning time covers the same work. The answers are evaluated and verified by the
runner with the engine's code, never by the planner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from bench.baselines import bucket_milp, megatron_dcp, static_deployed
from bench.flexsp_real import FlexSPSettings
from bench.workloads import Workload
from optimizer.costs.tables import CostTables
from optimizer.heuristic.static_layout import best_static
from optimizer.plan.plan import Assignment, Plan
from optimizer.problem.options import PlanOptions
from optimizer.problem.problem import Problem


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


def _bucket_milp(problem: Problem, workload: Workload) -> Outcome:
    opts = problem.options
    r = bucket_milp(CostTables.build(problem), opts.time_budget_ms / 1000.0, workers=opts.solver_workers)
    return Outcome(r.assignment, r.message, r.to_json())


def flexsp_planner(settings: FlexSPSettings) -> Planner:
    """The real FlexSP solver (:mod:`bench.flexsp_real`) with ``settings``; its wall time is in ``details``."""

    def run(problem: Problem, workload: Workload) -> Outcome:
        from bench.flexsp_real import solve

        r = solve(CostTables.build(problem), settings)
        return Outcome(r.assignment, r.note, r.details)

    return run


DEFAULT_OPTIONS_MICRO_BATCHES = 64
"""Micro-batch cap given to dhp at its default options, only if the defaults cap the count at all."""


def dhp_default(budget_ms: float, backend: str = "auto") -> Planner:
    """``plan()`` with the engine's default options except the budget and backend (and a micro-batch cap
    of at least :data:`DEFAULT_OPTIONS_MICRO_BATCHES` where the defaults still cap it): dhp as users call it."""

    def run(problem: Problem, workload: Workload) -> Outcome:
        from planning.planner import plan

        base = PlanOptions()
        cap = None if base.max_micro_batches is None else max(base.max_micro_batches, DEFAULT_OPTIONS_MICRO_BATCHES)
        options = replace(base, time_budget_ms=budget_ms, backend=backend, max_micro_batches=cap)
        p = plan(replace(problem, options=options))
        s = p.solver
        details = {"backend": s.backend, "status": s.status, "phases": s.details.get("phases", {}), "chosen": s.details.get("chosen"),
                   "budget_ms": budget_ms, "solver_wall_ms": s.wall_ms}
        return Outcome(plan_assignment(p, problem), s.fallback_reason, details)

    return run


def _dhp(backend: str) -> Planner:
    def run(problem: Problem, workload: Workload) -> Outcome:
        from planning.planner import plan

        p = plan(replace(problem, options=replace(problem.options, backend=backend)))  # as users call it: static layout as a floor
        s = p.solver
        details = {"backend": s.backend, "status": s.status, "phases": s.details.get("phases", {}), "chosen": s.details.get("chosen")}
        return Outcome(plan_assignment(p, problem), s.fallback_reason, details)

    return run


PLANNERS: dict[str, Planner] = {
    "static-deployed": _static_deployed,
    "static-best": _static_best,
    "megatron-dcp": _megatron,
    "bucket-milp": _bucket_milp,
    "flexsp": flexsp_planner(FlexSPSettings()),
    "dhp-heuristic": _dhp("heuristic"),
    "dhp-auto": _dhp("auto"),
    "dhp-heuristic-default": dhp_default(200.0, "heuristic"),
    "dhp-default": dhp_default(200.0),
    "dhp-1s": dhp_default(1000.0),
}
"""All planners, in report order. ``dhp-auto`` is the heuristic then an exact backend when one is installed; ``dhp-default``,
``dhp-1s`` and ``dhp-heuristic-default`` plan with the engine's default options (200 ms, 1 s, heuristic only) rather than the
grid's. ``flexsp`` is the real FlexSP solver (settings from the grid: :func:`planner_for`)."""

DEFAULT_EXCLUDED = ("flexsp", "dhp-heuristic-default", "dhp-default", "dhp-1s")
"""Planners only run when asked for (``--planners``, or the flexsp suite): the real FlexSP solver takes minutes per batch."""


def planner_for(name: str, flexsp: FlexSPSettings | None = None) -> Planner:
    """The planner called ``name``; ``flexsp`` with the given settings."""
    if name == "flexsp" and flexsp is not None:
        return flexsp_planner(flexsp)
    return PLANNERS[name]

LABELS = {
    "static-deployed": "static as deployed",
    "static-best": "static at its best",
    "megatron-dcp": "Megatron dynamic-CP greedy",
    "bucket-milp": "bucket MILP (home-made, FlexSP's idea)",
    "flexsp": "FlexSP (real solver)",
    "dhp-heuristic": "dhp heuristic",
    "dhp-auto": "dhp heuristic + solver",
    "dhp-heuristic-default": "dhp heuristic only (defaults)",
    "dhp-default": "dhp @ 200 ms (defaults)",
    "dhp-1s": "dhp @ 1 s",
}


def default_planners() -> list[str]:
    """Every planner but :data:`DEFAULT_EXCLUDED`; ``dhp-auto`` only when an exact backend is installed (else it equals
    the heuristic), ``bucket-milp`` only when OR-Tools is (``pip install 'dhp-planner[bench]'``)."""
    names = [n for n in PLANNERS if n not in DEFAULT_EXCLUDED]
    try:
        from solver_models import available_backends

        have = available_backends()
    except Exception:  # noqa: BLE001 - a broken optional backend must not stop a benchmark
        have = []
    if not have:
        names.remove("dhp-auto")
    try:
        import ortools  # noqa: F401 - the bucket MILP needs CP-SAT
    except ModuleNotFoundError:
        names.remove("bucket-milp")
    return names
