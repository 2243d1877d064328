"""The planners a benchmark compares, behind one call: problem in, assignment out.

Every planner starts from the same :class:`~optimizer.problem.problem.Problem` and builds its own cost
tables, so its planning time covers the same work. The answers are evaluated and verified by the
runner with the engine's code, never by the planner.

Rules: most planners plan under the grid's options (``default``); those of :data:`PLANNER_RULES` plan,
are verified and are bounded under the rules of a runtime instead (:data:`RULES`): ``megatron`` is
Megatron-Core's hybrid context parallelism (:data:`trainer.megatron.MEGATRON_RULES`: its aligned process
groups, one sub-sample at a time in memory; barrier groups uncapped, as Megatron's scheduler makes as
many as it needs). The runner hands them the problem under those rules (:func:`under_rules`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from bench.baselines import bucket_milp, static_deployed
from bench.baselines.megatron_real import available as megatron_available
from bench.baselines.megatron_real import capacity, megatron_plan
from bench.flexsp_real import FlexSPSettings
from bench.workload_catalog import Workload
from optimizer.costs.tables import CostTables
from optimizer.errors import ProblemError
from optimizer.heuristic.static_layout import best_static
from optimizer.plan.records import Assignment, Plan
from optimizer.problem.options import PlanOptions
from optimizer.problem.problem import Problem
from trainer.megatron import MEGATRON_RULES, DomainGroup


@dataclass
class Outcome:
    """A planner's answer: the assignment (None when it has no plan) and what it says about it."""

    assignment: Assignment | None
    note: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    wall_ms: float | None = None
    """The planner's own timing of the call it stands for (a scheduler's call without the conversion
    around it); None: the runner's timing of the whole call is the planner's wall time."""


Planner = Callable[[Problem, Workload], Outcome]


def plan_assignment(plan: Plan, problem: Problem) -> Assignment:
    """The assignment behind a plan (sample ids back to indices)."""
    index = problem.batch.index
    return Assignment(
        tuple(tuple((g.ranks, tuple(index[s] for s in g.samples)) for g in mb.groups) for mb in plan.micro_batches)
    )


def _static_deployed(problem: Problem, workload: Workload) -> Outcome:
    a = static_deployed(CostTables.build(problem), workload.max_length)
    return Outcome(a, None if a else f"the CP size for {workload.max_length} tokens exceeds the domain")


def _static_best(problem: Problem, workload: Workload) -> Outcome:
    found = best_static(CostTables.build(problem))
    if found is None:
        return Outcome(None, "no static power-of-two layout fits")
    return Outcome(found[1], details={"degree": found[0].degree, "micro_batches": found[0].micro_batches})


def _megatron(problem: Problem, workload: Workload) -> Outcome:
    r = megatron_plan(problem)
    return Outcome(r.assignment, r.note, r.details, r.wall_ms)


def _bucket_milp(problem: Problem, workload: Workload) -> Outcome:
    opts = problem.options
    r = bucket_milp(CostTables.build(problem), opts.budget_ms / 1000.0, workers=opts.solver_workers)
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
        details = {
            "backend": s.backend,
            "status": s.status,
            "phases": s.details.get("phases", {}),
            "chosen": s.details.get("chosen"),
            "budget_ms": budget_ms,
            "solver_wall_ms": s.wall_ms,
        }
        return Outcome(plan_assignment(p, problem), s.fallback_reason, details)

    return run


def _dhp(backend: str) -> Planner:
    def run(problem: Problem, workload: Workload) -> Outcome:
        from planning.planner import plan

        p = plan(
            replace(problem, options=replace(problem.options, backend=backend))
        )  # as users call it: static layout as a floor
        s = p.solver
        details = {
            "backend": s.backend,
            "status": s.status,
            "phases": s.details.get("phases", {}),
            "chosen": s.details.get("chosen"),
        }
        return Outcome(plan_assignment(p, problem), s.fallback_reason, details)

    return run


MEGATRON_BUDGET_MS = 200.0
"""Planning budget of ``dhp-megatron`` (the scheduler's default)."""


def dhp_megatron(request: Mapping[str, Any], budget_ms: float = MEGATRON_BUDGET_MS) -> Planner:
    """dhp as Megatron-Core's scheduler (:class:`trainer.megatron.PlannedCPScheduler`) in process, made from the
    request's cluster, model (its preset name under the analytical profile) and profile, at Megatron's
    per-rank capacity; one scheduler per capacity and domain, made on first use (its construction, with
    the planner's warm-up, is in ``details`` of that call). It is fed the (index, length) list Megatron's
    own scheduler gets, and its schedule becomes the assignment Megatron would run
    (:func:`trainer.megatron.assignment_of`); the wall time is that of ``get_groups_and_subsamples``. Like Megatron's
    scheduler it sees lengths only: under a profile with vision-encoder terms (the analytical one) it plans without
    them, while the runner scores with them."""
    schedulers: dict[tuple[int, int], Any] = {}

    def run(problem: Problem, workload: Workload) -> Outcome:
        from trainer.megatron import PlannedCPScheduler, assignment_of

        key = (capacity(problem), problem.domain_size)
        details: dict[str, Any] = {"budget_ms": budget_ms}
        scheduler = schedulers.get(key)
        if scheduler is None:
            start = time.perf_counter()
            scheduler = PlannedCPScheduler(
                key[0],
                DomainGroup(key[1]),
                profile=request.get("profile"),
                cluster=request["cluster"],
                budget_ms=budget_ms,
                model=request.get("model") or request.get("model_preset"),
            )
            details["construct_ms"] = (time.perf_counter() - start) * 1000.0
            schedulers[key] = scheduler
        pairs = [(i, int(length)) for i, length in enumerate(problem.batch.lengths)]
        start = time.perf_counter()
        _, sample_id_groups = scheduler.get_groups_and_subsamples(pairs, None)
        wall = (time.perf_counter() - start) * 1000.0
        solver = scheduler.last.get("plan", {}).get("solver", {})
        details.update(
            predicted_step_time_s=scheduler.last.get("predicted_step_time_s"),
            backend=solver.get("backend"),
            status=solver.get("status"),
            barrier_groups=len(sample_id_groups),
        )
        return Outcome(assignment_of(sample_id_groups, {i: i for i in range(len(pairs))}), None, details, wall)

    return run


PLANNERS: dict[str, Planner] = {
    "static-deployed": _static_deployed,
    "static-best": _static_best,
    "static-best-megatron": _static_best,
    "megatron": _megatron,
    "bucket-milp": _bucket_milp,
    "flexsp": flexsp_planner(FlexSPSettings()),
    "dhp-heuristic": _dhp("heuristic"),
    "dhp-auto": _dhp("auto"),
    "dhp-heuristic-default": dhp_default(200.0, "heuristic"),
    "dhp-default": dhp_default(200.0),
    "dhp-1s": dhp_default(1000.0),
}
"""The planners that plan from the problem alone. ``dhp-auto`` is the heuristic then an exact backend when one is
installed; ``dhp-default``, ``dhp-1s`` and ``dhp-heuristic-default`` plan with the engine's default options (200 ms,
1 s, heuristic only) rather than the grid's. ``flexsp`` is the real FlexSP solver (settings from the grid:
:func:`planner_for`); ``megatron`` is Megatron-Core's own scheduler (:mod:`bench.baselines.megatron_real`);
``static-best-megatron`` is static at its best under Megatron's rules (one CP size for the batch, as a Megatron job
could run it: the floor a dynamic schedule must beat there)."""

REQUEST_PLANNERS: dict[str, Callable[[Mapping[str, Any]], Planner]] = {"dhp-megatron": dhp_megatron}
"""Planners made from the request documents of a cell (cluster, model, profile) as well: :func:`planner_for`."""

NAMES: tuple[str, ...] = (
    "static-deployed",
    "static-best",
    "static-best-megatron",
    "megatron",
    "bucket-milp",
    "flexsp",
    "dhp-heuristic",
    "dhp-auto",
    "dhp-heuristic-default",
    "dhp-default",
    "dhp-1s",
    "dhp-megatron",
)
"""Every planner, in report order."""

DEFAULT_EXCLUDED = ("flexsp", "dhp-heuristic-default", "dhp-default", "dhp-1s", "dhp-megatron", "static-best-megatron")
"""Planners only run when asked for (``--planners``, or their suites): the real FlexSP solver takes minutes per batch;
dhp at its default options belongs to the flexsp suite, dhp as Megatron's scheduler and static under Megatron's rules
to the megatron suite."""

DEFAULT_RULES = "default"
RULES: dict[str, dict[str, Any]] = {DEFAULT_RULES: {}, "megatron": {**MEGATRON_RULES, "max_micro_batches": None}}
"""Planner options of each set of rules, over the grid's (see the module docstring)."""
PLANNER_RULES: dict[str, str] = {"megatron": "megatron", "dhp-megatron": "megatron", "static-best-megatron": "megatron"}


def rules_of(name: str) -> str:
    """The rules the planner ``name`` plans and is scored under."""
    return PLANNER_RULES.get(name, DEFAULT_RULES)


def under_rules(problem: Problem, rules: str) -> Problem:
    """``problem`` under ``rules`` (:data:`RULES`)."""
    options = RULES[rules]
    return problem.with_options(**options) if options else problem


def planner_for(name: str, flexsp: FlexSPSettings | None = None, request: Mapping[str, Any] | None = None) -> Planner:
    """The planner called ``name``; ``flexsp`` with the given settings; those of :data:`REQUEST_PLANNERS` from
    ``request`` (the cell's request document, :func:`bench.grid.make_request`)."""
    if name in REQUEST_PLANNERS:
        if request is None:
            raise ProblemError(
                f"planner {name!r} is made from the request documents",
                field="planners",
                hint=f"call planner_for({name!r}, request=bench.grid.make_request(...)).",
            )
        return REQUEST_PLANNERS[name](request)
    if name == "flexsp" and flexsp is not None:
        return flexsp_planner(flexsp)
    return PLANNERS[name]


LABELS = {
    "static-deployed": "static as deployed",
    "static-best": "static at its best",
    "static-best-megatron": "static at its best (Megatron's rules)",
    "megatron": "Megatron-Core scheduler (real; its rules)",
    "bucket-milp": "bucket MILP (home-made, FlexSP's idea)",
    "flexsp": "FlexSP (real solver)",
    "dhp-heuristic": "dhp heuristic",
    "dhp-auto": "dhp heuristic + solver",
    "dhp-heuristic-default": "dhp heuristic only (defaults)",
    "dhp-default": "dhp @ 200 ms (defaults)",
    "dhp-1s": "dhp @ 1 s",
    "dhp-megatron": "dhp as Megatron's scheduler (its rules)",
}


def default_planners() -> list[str]:
    """Every planner but :data:`DEFAULT_EXCLUDED`; ``dhp-auto`` only when an exact backend is installed (else it equals
    the heuristic), ``bucket-milp`` only when OR-Tools is (``pip install 'dhp-planner[bench]'``), ``megatron`` only when
    megatron-core is (``pip install 'dhp-planner[megatron]'``)."""
    names = [n for n in NAMES if n not in DEFAULT_EXCLUDED]
    if not megatron_available():
        names.remove("megatron")
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
