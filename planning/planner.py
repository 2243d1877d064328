"""Orchestration: the heuristic first, then an exact backend for the rest of the budget.

``plan(problem)`` always returns a verified plan or raises a domain error. :func:`_plan` runs the steps
in this order, one function each:

0. refuse at once a budget below the batch's fixed work on this machine (:mod:`planning.fixed_work`:
   the tables, a first plan, building and verifying it), naming the budget to ask for (:func:`_tables`);
1. build the cost tables and the lower bound: every bound of :mod:`optimizer.bounds.lower_bounds`
   when the time left covers them after the fixed work still to come, else the cheapest valid one
   (the tighter ones follow step 2 when time is left then) (:func:`_tables`, :func:`_first_bound`);
2. run the heuristic (it answers in milliseconds and is the fallback) (:func:`_heuristic`); attach
   the best static power-of-two layout for comparison (it is a plan too: the answer is never slower)
   (:func:`_static_layout`); the tighter bounds when deferred (:func:`_tighter_bounds`); when the plan
   is more than 1% above the bound, raise the bound with the group-size LP if time allows, before an exact
   backend or when ``options.tight_bound`` asks for it (:mod:`planning.size_bound_step`, :func:`_group_size_bound`);
3. if the options ask for it and time is left, run an exact backend (:mod:`planning.backends`)
   with the best assignment so far as a full hint, until the solver's deadline (:func:`_backend`,
   chosen once, and :func:`_exact_solve`); a solver failure, time-out or invalid answer is recorded as
   the fallback reason, never raised;
4. keep the fastest candidate: the solver's or the heuristic's plan, or the static layout (:func:`_fastest`);
5. move groups onto the job's existing communicators when asked (:mod:`planning.existing_groups`,
   :func:`_existing_groups`);
6. build the plan and verify it independently; a solver's plan that fails gives way to the heuristic's
   (:func:`_build_and_verify`); the statistics get the call's wall time and phases (:func:`_with_details`).

Each optional phase (the tighter bounds, the static layout, the LP, the solver, the heuristic's
strategies after its first plan) starts only when the time left after the reserve for building and
verifying covers it, estimated from the rates measured here; what steps aside is named, with its
reason, in ``solver.details["skipped"]`` (the summary prints it).

One :class:`planning.deadline.Deadline` covers the whole call: the caller's (the service creates it
when the request arrives) or one started here from ``options.time_budget_ms`` (``"auto"`` worked out
first from the previous step's time: :func:`planning.budget_policy.resolve_budget`; the plan's
``solver.budget_ms`` is the budget, ``solver.details["budget"]`` how ``"auto"`` came to it). Every phase gets its
instant from it once, through the budget policy (:mod:`planning.budget_policy`). With
``options.deterministic`` the answer depends on the input alone: no budget is refused and nothing
optional is skipped, the heuristic runs all its strategies whatever the clock says, and the backends
run a fixed amount of work.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

from optimizer import jit
from optimizer.bounds.lower_bounds import bound_parts, memory_proof, quick_bound_parts
from optimizer.bounds.tightness import tightness_note
from optimizer.costs.tables import CostTables
from optimizer.errors import InfeasibleError, ProblemError
from optimizer.gc_pause import collector_paused, freeze_long_lived
from optimizer.heuristic.roomy_ranks import roomy_plan
from optimizer.heuristic.static_layout import best_static, no_static_reason
from optimizer.heuristic.strategies import heuristic_plan
from optimizer.plan.aligned import align_blocks
from optimizer.plan.evaluate import assignment_step_time, build_plan
from optimizer.plan.records import Assignment, Plan, SolverStats, StaticBaseline, TracePoint
from optimizer.problem.problem import Problem
from optimizer.verify.verifier import verify
from planning.backends import Backends, Choice, NoSolve, choose_backend, no_time_for, rescue, run_backend
from planning.budget_policy import PhaseBudget, SolveWindow, phase_budget, resolve_budget, solver_budget_ms
from planning.deadline import Deadline
from planning.existing_groups import reuse_groups
from planning.fixed_work import problem_budget_ms, problem_estimate_ms, suggested_budget_ms
from planning.kernel_choice import choose_kernels
from planning.size_bound_step import size_bound_skipped, size_bound_within
from planning.warm import warm_up_with, warmed

OPTIMAL_GAP = 1e-4
"""Status "optimal" promises a step time within this share of a proven lower bound (the exact models
round times up to 0.1 us units, so a proof is never closer than that rounding)."""

Static = tuple[StaticBaseline, Assignment]
"""The best static power-of-two layout: its summary and its assignment."""


def plan(
    problem: Problem,
    *,
    deadline: Deadline | None = None,
    backends: Backends | None = None,
    compare_static: bool = True,
    clock: Callable[[], float] = time.perf_counter,
    warm: bool = True,
) -> Plan:
    """The verified plan of ``problem`` (see the module docstring). ``backends`` maps names to exact
    backends (default: the built-in ones of :mod:`solver_models`). ``warm``: load every compiled kernel
    first, once per process (:func:`warm_up`; while another thread's warm-up runs, it pauses for this
    plan instead: :func:`planning.warm.warmed`); without it each kernel loads when the plan first runs it,
    within the deadline (a process that plans once, whose deadline counts its start-up: ``dhp plan``)."""
    with warmed(_plan_unwarmed) if warm else nullcontext():  # once per process, before the clock starts
        problem = resolve_budget(problem)  # "auto" becomes a number (a problem the service resolved stays)
        choose_kernels(problem)  # the Python forms or the compiled ones (planning.kernel_choice)
        if deadline is None:
            deadline = Deadline.after_ms(problem.options.budget_ms, clock=clock)
        if backends is None:
            from solver_models import builtin_backends

            backends = builtin_backends()
        with collector_paused():
            return _plan(problem, compare_static, deadline, backends)


def warm_up() -> float:
    """Load every compiled kernel by planning small requests, once per process (:mod:`planning.warm`);
    the milliseconds spent (0 after the first call)."""
    return warm_up_with(_plan_unwarmed)


def _plan_unwarmed(problem: Problem) -> Plan:
    """A plan without the warm-up (the warm-up's own plans)."""
    from solver_models import builtin_backends

    with collector_paused():
        return _plan(problem, True, Deadline.after_ms(problem.options.budget_ms), builtin_backends())


def _plan(problem: Problem, compare_static: bool, deadline: Deadline, backends: Backends) -> Plan:
    """The steps of the module docstring, in order; each step records its own lap (:class:`Laps`)."""
    laps = Laps(deadline)
    tables = _tables(problem, deadline, laps)
    run = _Run(problem, tables, phase_budget(deadline, tables), backends, laps)
    bound = _first_bound(run)
    first = _heuristic(run, bound)
    static = _static_layout(run, compare_static)
    bound = _tighter_bounds(run, bound)
    window = run.budget.solver_window(tables, first.eval_ms)
    choice = _backend(run, first, window)
    bound = _group_size_bound(run, bound, first, static, window, choice.name)
    chosen, stats = _exact_solve(run, choice, first, static, bound, window)
    chosen, stats = _fastest(run, chosen, stats, static)
    chosen, hint = _existing_groups(run, chosen, first.hint)
    result = _build_and_verify(run, chosen, hint, stats, bound, static)
    return _with_details(run, result, bound, first.strategies)


class Laps:
    """Milliseconds of each phase of one plan (``solver.details["phases"]``), from the deadline's start.

    ``queue_ms`` is the wait before planning began (when the caller's deadline started earlier). A step
    records its lap when it has done its work: the time since the previous lap. A step that did
    nothing records none, and its moment counts in the next lap."""

    def __init__(self, deadline: Deadline) -> None:
        self.clock = deadline.clock
        self.mark = self.clock()
        self.phases: dict[str, float] = {}
        if self.mark > deadline.start:
            self.phases["queue_ms"] = round((self.mark - deadline.start) * 1000.0, 3)

    def lap(self, name: str) -> None:
        now = self.clock()
        self.phases[name] = round((now - self.mark) * 1000.0, 3)
        self.mark = now


@dataclass(frozen=True)
class _Run:
    """What every step of one plan reads, and where the steps note what steps aside (``skipped``)."""

    problem: Problem
    tables: CostTables
    budget: PhaseBudget
    backends: Backends
    laps: Laps
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def start(self) -> float:
        return self.budget.deadline.start

    @property
    def clock(self) -> Callable[[], float]:
        return self.budget.deadline.clock


@dataclass(frozen=True)
class _Bound:
    """The best lower bound in hand (the engine's, without the per-step constant) and which one binds;
    ``tight`` once every bound of :mod:`optimizer.bounds.lower_bounds` is in, ``raised`` once a step
    after the first raised it."""

    value: float
    binding: str
    tight: bool
    raised: bool = False

    def raised_to(self, value: float, binding: str) -> _Bound:
        """This bound, or ``value`` bound by ``binding`` when that is higher."""
        return replace(self, value=value, binding=binding, raised=True) if value > self.value else self


@dataclass(frozen=True)
class _First:
    """The heuristic's plan (or the roomiest nodes', or the whole exact model's when it found none),
    aligned and evaluated, with the statistics it is reported with."""

    hint: Assignment
    step_s: float
    eval_ms: float
    stats: SolverStats
    strategies: dict[str, Any]
    rescued: bool


def _tables(problem: Problem, deadline: Deadline, laps: Laps) -> CostTables:
    """Steps 0 and 1: refuse a budget below the fixed work, then the cost tables and their time matrices."""
    if not problem.options.deterministic:
        refuse_short_budget(problem, deadline)
    tables = CostTables.build(problem)
    tables.prepare()
    laps.lap("tables_ms")
    return tables


def _first_bound(run: _Run) -> _Bound:
    """Step 1: every lower bound when there is time for them before the heuristic, else the cheapest valid one."""
    tight = run.budget.tight_bounds_first()
    parts = bound_parts(run.tables) if tight else quick_bound_parts(run.tables)
    binding = max(parts, key=parts.__getitem__)
    run.laps.lap("bound_ms")
    return _Bound(parts[binding], binding, tight)


def _heuristic(run: _Run, bound: _Bound) -> _First:
    """Step 2: the heuristic's plan until the budget's heuristic instant, evaluated.

    When it finds no packing at the smallest rank capacity: on a mixed cluster the roomiest nodes alone
    may hold the batch; else, on a small problem, the whole exact model may find a plan (rescue)."""
    tables, due = run.tables, run.budget.heuristic_due
    strategies: dict[str, Any] = {}
    rescued: SolverStats | None = None
    try:
        hint = heuristic_plan(tables, deadline=due, bound=bound.value, report=strategies)
    except InfeasibleError as exc:
        roomy = None if memory_proof(tables) else roomy_plan(tables, due)
        if roomy is not None:
            hint = roomy[0]
            strategies.update(strategy="roomiest nodes", roomiest_nodes=roomy[1])
        else:
            hint, rescued = rescue(tables, exc, run.backends, run.budget.rescue, run.start, run.clock)
    hint = align_blocks(tables, hint)
    run.laps.lap("heuristic_ms")
    clock = run.clock
    eval_start = clock()
    step_s = assignment_step_time(tables, hint)
    if not math.isfinite(step_s):
        raise ProblemError(
            f"gives a step time of {step_s} s, not a finite number of seconds",
            field="profile" if run.problem.profile is not None else "cluster",
            hint="check the cost coefficients (seconds, bytes, FLOP/s in SI units) for values too large or too small.",
        )
    eval_ms = (clock() - eval_start) * 1000.0
    if rescued is not None:
        return _First(hint, step_s, eval_ms, rescued, strategies, True)
    h_ms = (clock() - run.start) * 1000.0
    stats = SolverStats(
        backend="heuristic",
        status="heuristic",
        wall_ms=h_ms,
        objective_s=step_s,
        bound_s=bound.value,
        trace=(TracePoint(h_ms, step_s, bound.value),),
    )
    return _First(hint, step_s, eval_ms, stats, strategies, False)


def _static_layout(run: _Run, compare_static: bool) -> Static | None:
    """Step 2: the best static power-of-two layout, for comparison and as a candidate, when asked and time allows."""
    if not compare_static:
        run.skipped["static_baseline"] = "not asked for"
        return None
    if (why := run.budget.room_for("static")) is not None:
        run.skipped["static_baseline"] = f"not computed: {why}"
        return None
    ruled_out: dict[int, str] = {}
    static = best_static(run.tables, ruled_out)
    if static is None:
        run.skipped["static_baseline"] = no_static_reason(ruled_out)
    run.laps.lap("static_ms")
    return static


def _tighter_bounds(run: _Run, bound: _Bound) -> _Bound:
    """Step 2: the tighter bounds, after the heuristic, when step 1 had no time for them and time is left now."""
    if bound.tight:
        return bound
    if (why := run.budget.room_for("tight_bound")) is not None:
        run.skipped["tighter_bounds"] = f"only the single-sample bound: {why}"
        return bound
    parts = bound_parts(run.tables)
    tight = replace(bound.raised_to(max(parts.values()), max(parts, key=parts.__getitem__)), tight=True)
    run.laps.lap("tight_bound_ms")
    return tight


def _backend(run: _Run, first: _First, window: SolveWindow) -> Choice:
    """The exact backend for step 3 (``heuristic``: none), chosen once; none after a rescue (the whole model ran)."""
    if first.rescued:
        return Choice("heuristic")
    deterministic = run.problem.options.deterministic
    return choose_backend(
        run.tables,
        run.problem.options.backend,
        run.budget.solver_ms(window) + window.reserve_ms,
        run.backends,
        window.reserve_ms,
        deterministic,
    )


def _group_size_bound(
    run: _Run, bound: _Bound, first: _First, static: Static | None, window: SolveWindow, backend: str
) -> _Bound:
    """Step 2: the group-size LP bound when the best plan so far is far above the bound, an exact backend
    follows or the options ask for it (:func:`planning.size_bound_step.size_bound_skipped`), and time allows:
    asked for, all the time up to the solver's deadline."""
    upper = min(first.step_s, static[0].predicted_step_time_s) if static is not None else first.step_s
    options = run.problem.options
    if (why := size_bound_skipped(options, backend, upper, bound.value)) is not None:
        run.skipped["group_size_bound"] = why
        return bound
    due = run.budget.size_bound_due(window, solver_follows=backend != "heuristic" and not options.tight_bound)
    sized = size_bound_within(run.tables, upper, bound.value, due, run.clock)
    if sized is None:
        return bound
    run.laps.lap("size_bound_ms")
    return bound.raised_to(sized, "group_sizes")


def _exact_solve(
    run: _Run, choice: Choice, first: _First, static: Static | None, bound: _Bound, window: SolveWindow
) -> tuple[Assignment, SolverStats]:
    """Step 3: the chosen backend from the best plan known (the heuristic's, or the static layout when faster)
    until the solver's deadline; the heuristic's plan and statistics when no backend runs, with the reason
    when one was asked for (by name or ``auto``) and none ran."""
    stats = first.stats
    if bound.raised:
        stats = replace(stats, bound_s=max(bound.value, stats.bound_s or 0.0))
    backend = choice.name
    if backend == "heuristic":
        if choice.skip is None:
            return first.hint, stats
        return first.hint, replace(stats, fallback_reason=_no_solver(run, "auto", choice.skip, window))
    skip = no_time_for(backend, run.budget.solver_ms(window), run.backends, run.problem.options.deterministic)
    if skip:
        why = _no_solver(run, backend, skip, window)
        return first.hint, replace(stats, backend=backend, status="fallback", fallback_reason=why)
    hint, hint_s = first.hint, first.step_s
    faster = static if static is not None and static[0].predicted_step_time_s < hint_s * (1 - 1e-9) else None
    if faster is not None:
        hint, hint_s = faster[1], faster[0].predicted_step_time_s
    chosen, stats = run_backend(
        run.tables, backend, run.backends, hint, hint_s, bound.value, window, stats, run.start, run.clock
    )
    if faster is not None:
        stats = replace(stats, details={**stats.details, "solver_start": f"static layout CP {faster[0].degree}"})
    run.laps.lap("solver_ms")
    return chosen, stats


def _no_solver(run: _Run, backend: str, skip: NoSolve, window: SolveWindow) -> str:
    """Why no exact backend ran, with the budget's figures and, when more time would have started ``backend``
    (a name or ``auto``), the budget that would (:func:`planning.budget_policy.solver_budget_ms`)."""
    deadline = run.budget.deadline
    heuristic_ms = run.laps.phases.get("heuristic_ms")
    of = f" (the heuristic {heuristic_ms:.0f} ms)" if heuristic_ms is not None else ""
    text = f"no solver ran: planning used {deadline.elapsed_ms():.0f} of {deadline.budget_ms:.0f} ms{of}; {skip.why}"
    fixes = [skip.instead] if skip.instead else []
    if skip.need_ms is not None:
        phases = list(run.laps.phases)
        since = phases[phases.index("heuristic_ms") + 1 :] if "heuristic_ms" in phases else []
        after_ms = sum(run.laps.phases[k] for k in since) + (deadline.clock() - run.laps.mark) * 1000.0
        asked = run.problem.options.time_budget_ms  # a number, or one the planner works out ("auto")
        # What the caller kept back from the budget asked for (the service's reserve) is asked for again.
        kept_back_ms = max(0.0, asked - deadline.budget_ms) if isinstance(asked, (int, float)) else 0.0
        budget_ms = kept_back_ms + solver_budget_ms(
            skip.need_ms, window.reserve_ms, after_ms, deadline.elapsed_ms(), _heuristic_cut(run)
        )
        fixes.insert(0, f"give a larger budget: options.time_budget_ms {budget_ms:.0f} leaves a solver that time here")
    return f"{text}. To fix: {', or '.join(fixes)}" if fixes else text


def _heuristic_cut(run: _Run) -> bool:
    """Whether the heuristic may have stopped for its instant (:meth:`PhaseBudget.heuristic_cut_short`)."""
    if "heuristic_ms" not in run.laps.phases:
        return False
    phases = list(run.laps.phases)
    ended_ms = sum(run.laps.phases[k] for k in phases[: phases.index("heuristic_ms") + 1])
    return run.budget.heuristic_cut_short(ended_ms)


def _fastest(
    run: _Run, chosen: Assignment, stats: SolverStats, static: Static | None
) -> tuple[Assignment, SolverStats]:
    """Step 4: the static layout is a plan like any other: never return something slower."""
    chosen_s = stats.objective_s if stats.objective_s is not None else assignment_step_time(run.tables, chosen)
    if static is not None and static[0].predicted_step_time_s < chosen_s * (1 - 1e-9):
        chosen = static[1]
        stats = replace(stats, details={**stats.details, "chosen": f"static layout CP {static[0].degree}"})
    return align_blocks(run.tables, chosen), stats


def _existing_groups(run: _Run, chosen: Assignment, hint: Assignment) -> tuple[Assignment, Assignment]:
    """Step 5: the chosen plan and the heuristic's (its fallback) on the job's existing communicators when asked."""
    due = run.budget.reuse_due
    reused, hint_reused = reuse_groups(run.tables, chosen, due), reuse_groups(run.tables, hint, due)
    if reused is chosen and hint_reused is hint:
        return chosen, hint
    run.laps.lap("group_reuse_ms")
    return reused, hint_reused


def _build_and_verify(
    run: _Run, chosen: Assignment, hint: Assignment, stats: SolverStats, bound: _Bound, static: Static | None
) -> Plan:
    """Step 6: build the plan and verify it independently; a solver's plan that fails gives way to the heuristic's."""
    tables, baseline = run.tables, static[0] if static else None
    result = build_plan(tables, chosen, stats, max(bound.value, stats.bound_s or 0.0), baseline)
    result = replace(result, solver=honest_status(result.solver, result.predicted_step_time_s, result.lower_bound_s))
    run.laps.lap("build_ms")
    report = verify(result, run.problem)
    run.laps.lap("verify_ms")
    if not report.ok and chosen is not hint:
        why = "solver plan failed verification: " + report.violations[0]
        result = build_plan(tables, hint, replace(stats, status="fallback", fallback_reason=why), bound.value, baseline)
        report = verify(result, run.problem)
    report.raise_if_failed()
    return result


def _with_details(run: _Run, result: Plan, bound: _Bound, strategies: dict[str, Any]) -> Plan:
    """The plan with the whole call's wall time, its phases, the binding bound, the heuristic's report,
    what was skipped and, without a static layout, why there is none."""
    wall_ms = (run.clock() - run.start) * 1000.0
    binding = bound.binding
    # build_plan adds the per-step constant to the engine's bound; a higher bound is the solver's proof.
    if result.lower_bound_s > (bound.value + run.problem.cost_profile.step_constant) * (1 + 1e-12):
        binding = f"{result.solver.backend} (proven by the solver)"
    details = {
        **result.solver.details,
        "phases": run.laps.phases,
        "bound": binding,
        **({"bound_tightness": note} if (note := tightness_note(binding)) else {}),
        "heuristic": strategies,
        "kernels": "compiled" if jit.loaded() else "python",
        **({"skipped": run.skipped} if run.skipped else {}),
        **({"budget": run.problem.budget_reason} if run.problem.budget_reason else {}),
    }
    no_static = run.skipped.get("static_baseline") if result.static_baseline is None else None
    budget_ms = run.problem.options.budget_ms
    return replace(
        result,
        solver=replace(result.solver, wall_ms=wall_ms, budget_ms=budget_ms, details=details),
        static_baseline_reason=no_static,
    )


def refuse_short_budget(problem: Problem, deadline: Deadline) -> None:
    """Raise a ProblemError on ``options.time_budget_ms`` when the budget asked for cannot cover the batch's
    fixed work on this machine, before any of it is done.

    Only then: the threshold is :func:`planning.fixed_work.problem_budget_ms`, the least this machine
    needs (LOW_SHARE of the estimate at the rates of its fastest calibration run), so a budget that
    the fixed work fits is not refused. The budget judged is the one asked for (the options', or the
    caller's deadline when that is longer), never what is left of it: a request that waited for a solve
    worker, or a caller that kept part of the budget back, is planned with the time left, not refused.
    The message names the estimate, the hint a budget that covers it with headroom."""
    asked_ms = max(problem.options.budget_ms, deadline.budget_ms)
    if asked_ms >= problem_budget_ms(problem):
        return
    expected = problem_estimate_ms(problem)
    raise ProblemError(
        f"is {asked_ms:.0f} ms, but the batch of {len(problem.batch)} samples on {problem.cluster.domain_size} ranks "
        f"needs about {expected:.0f} ms here (the cost tables, a first plan, building and verifying it), "
        "whatever else is skipped",
        field="options.time_budget_ms",
        hint=f"ask for options.time_budget_ms of at least {suggested_budget_ms(expected)}, or send a smaller batch.",
    )


def honest_status(stats: SolverStats, step_s: float, bound_s: float) -> SolverStats:
    """``stats`` with status ``optimal`` kept only when the plan's own step time is within
    OPTIMAL_GAP of the proven bound; otherwise ``feasible``, with the solver's claim in the details.

    A solver proves the optimum of its model; the plan is the model's answer decoded onto ranks and
    evaluated independently, so the two can differ (a group the model charged as spanning nodes may
    land inside one, times are rounded in the model, the plan may come from elsewhere).
    """
    if stats.status != "optimal" or step_s <= bound_s * (1 + OPTIMAL_GAP):
        return stats
    note = (
        f"{stats.backend} reported optimal, but the plan's {step_s:.9g} s is "
        f"{100 * (step_s / bound_s - 1):.4f}% above the proven bound {bound_s:.9g} s"
    )
    return replace(stats, status="feasible", details={**stats.details, "solver_claim": note})


SOLVER_MODULES = ("ortools.sat.python.cp_model", "highspy", "pulp")
"""Loaded once at start-up: a long-running service should not make its first requests pay the
solver libraries' import time (the planner's ``auto`` avoids CP-SAT while OR-Tools is not loaded)."""


def warm_up_service() -> list[str]:
    """Load the planner's compiled kernels and import the installed solver libraries and backends
    (for a long-running process, at start-up); returns the solver modules now loaded. The process
    keeps the memory it frees from then on (:mod:`planning.allocator`).

    Then everything loaded so far is frozen out of the cyclic collector
    (:func:`optimizer.gc_pause.freeze_long_lived`), the solver libraries too: code and libraries live as
    long as the process, and a full collection that walks them (60 to 130 ms once OR-Tools, HiGHS and
    PuLP are loaded, measured on the 2-core development machine) would stall every planning thread past
    its budget."""
    import importlib

    from planning.allocator import retain_freed_memory

    retain_freed_memory()
    warm_up()
    loaded = []
    for name in SOLVER_MODULES:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except ImportError:
            pass
    from solver_models import available_backends

    available_backends()
    freeze_long_lived()
    return loaded
