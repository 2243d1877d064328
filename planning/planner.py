"""Orchestration: the heuristic first, then an exact backend for the rest of the budget.

``plan(problem)`` always returns a verified plan or raises a domain error:

0. refuse at once a budget below the batch's fixed work on this machine (:mod:`planning.fixed_work`:
   the tables, a first plan, building and verifying it), naming the budget to ask for;
1. build the cost tables and the lower bound: every bound of :mod:`optimizer.bounds.lower_bounds`
   when the time left covers them after the fixed work still to come, else the cheapest valid one
   (the tighter ones follow step 2 when time is left then);
2. run the heuristic (it answers in milliseconds and is the fallback); attach the best static
   power-of-two layout for comparison (it is a plan too: the answer is never slower); when the plan
   is more than 1% above the bound, raise the bound with the group-size LP if time allows
   (:mod:`planning.size_bound_step`);
3. if the options ask for it and time is left, run an exact backend (:mod:`planning.backends`)
   with the best assignment so far as a full hint, until the deadline;
4. verify the candidates independently and keep the best valid one; a solver failure, time-out
   or invalid answer is recorded as the fallback reason, never raised;
5. move groups onto the job's existing communicators when asked (:mod:`planning.existing_groups`).

Each optional phase (the tighter bounds, the static layout, the LP, the solver, the heuristic's
strategies after its first plan) starts only when the time left after the reserve for building and
verifying covers it, estimated from the rates measured here; what steps aside is named, with its
reason, in ``solver.details["skipped"]`` (the summary prints it).

One :class:`planning.deadline.Deadline` covers the whole call: the caller's (the service creates it
when the request arrives) or one started here from ``options.time_budget_ms``. Every phase gets an
instant from it. With ``options.deterministic`` the answer depends on the input alone: no budget is
refused and nothing optional is skipped, the heuristic runs all its strategies whatever the clock
says, and the backends run a fixed amount of work.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from optimizer.bounds.lower_bounds import bound_parts, memory_proof, quick_bound_parts
from optimizer.costs.tables import CostTables
from optimizer.errors import InfeasibleError, ProblemError
from optimizer.gc_pause import collector_paused
from optimizer.heuristic.roomy_ranks import roomy_plan
from optimizer.heuristic.static_layout import best_static
from optimizer.heuristic.strategies import heuristic_plan
from optimizer.plan.aligned import align_blocks
from optimizer.plan.evaluate import assignment_step_time, build_plan
from optimizer.plan.records import Assignment, Plan, SolverStats, TracePoint
from optimizer.problem.problem import Problem
from optimizer.verify.verifier import verify
from planning.backends import (
    Backends,
    choose_backend,
    finish_reserve_ms,
    no_time_for,
    rescue,
    reserve_ms,
    run_backend,
    solver_may_follow,
)
from planning.deadline import Deadline
from planning.existing_groups import reuse_groups
from planning.fixed_work import SAFETY, phase_ms, problem_budget_ms, problem_estimate_ms, suggested_budget_ms
from planning.size_bound_step import size_bound_within
from planning.warm import warm_up_with

HEURISTIC_SHARE = 0.75
"""Share of the budget the heuristic may use when an exact backend follows (else HEURISTIC_ALONE)."""
HEURISTIC_ALONE = 0.9
HEURISTIC_MS_PER_SAMPLE = 0.01
"""Expected heuristic milliseconds per sample (measured 0.0015 to 0.003 from 512 to 65,536 samples);
a budget below heuristic + reserve + a solver's least time gives the heuristic HEURISTIC_ALONE."""
OPTIMAL_GAP = 1e-4
"""Status "optimal" promises a step time within this share of a proven lower bound (the exact models
round times up to 0.1 us units, so a proof is never closer than that rounding)."""


def plan(
    problem: Problem,
    *,
    deadline: Deadline | None = None,
    backends: Backends | None = None,
    compare_static: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> Plan:
    """The verified plan of ``problem`` (see the module docstring). ``backends`` maps names to exact
    backends (default: the built-in ones of :mod:`solver_models`)."""
    warm_up()  # once per process, before the budget's clock starts (planning.warm)
    if deadline is None:
        deadline = Deadline.after_ms(problem.options.time_budget_ms, clock=clock)
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
        return _plan(problem, True, Deadline.after_ms(problem.options.time_budget_ms), builtin_backends())


def _plan(problem: Problem, compare_static: bool, deadline: Deadline, backends: Backends) -> Plan:
    clock = deadline.clock
    start = deadline.start
    options = problem.options
    deterministic = options.deterministic
    phases: dict[str, float] = {}
    mark = clock()
    if mark > start:
        phases["queue_ms"] = round((mark - start) * 1000.0, 3)

    def lap(name: str) -> None:
        nonlocal mark
        now = clock()
        phases[name] = round((now - mark) * 1000.0, 3)
        mark = now

    if not deterministic:
        refuse_short_budget(problem, deadline)
    tables = CostTables.build(problem)
    tables.prepare()
    lap("tables_ms")
    n = tables.n_samples
    skipped: dict[str, str] = {}
    # The cheapest valid bound always; the tighter ones now when the time left covers them after the
    # fixed work still to come, else after the heuristic and the static layout if time is left then.
    tight_ms = phase_ms("tight_bound", n)
    tight_now = deterministic or deadline.left_ms() - reserve_ms(tables) - phase_ms("plan", n) >= SAFETY * tight_ms
    parts = bound_parts(tables) if tight_now else quick_bound_parts(tables)
    binding = max(parts, key=parts.__getitem__)
    bound = parts[binding]
    lap("bound_ms")
    solver_follows = solver_may_follow(
        tables, options.backend, deadline.budget_ms, HEURISTIC_SHARE, HEURISTIC_MS_PER_SAMPLE
    )
    # The heuristic's strategies after its first plan stop in time for the work after them (the static
    # comparison, building and verifying the plan: the reserve estimated from the batch's size).
    h_deadline = (
        None
        if deterministic
        else min(
            deadline.at(HEURISTIC_SHARE if solver_follows else HEURISTIC_ALONE),
            deadline.due - reserve_ms(tables) / 1000.0,
        )
    )
    rescued: SolverStats | None = None
    strategies: dict[str, Any] = {}
    try:
        hint = heuristic_plan(tables, deadline=h_deadline, bound=bound, report=strategies)
    except InfeasibleError as exc:
        # The heuristic found no packing at the smallest rank capacity: on a mixed cluster the roomiest
        # nodes alone may hold the batch; else, on a small problem, the whole exact model may find a plan.
        roomy = None if memory_proof(tables) else roomy_plan(tables, h_deadline)
        if roomy is not None:
            hint = roomy[0]
            strategies.update(strategy="roomiest nodes", roomiest_nodes=roomy[1])
        else:
            hint, rescued = rescue(tables, exc, backends, deadline.due - reserve_ms(tables) / 1000.0, start, clock)
    hint = align_blocks(tables, hint)
    lap("heuristic_ms")
    eval_start = clock()
    h_time = assignment_step_time(tables, hint)
    if not math.isfinite(h_time):
        raise ProblemError(
            f"gives a step time of {h_time} s, not a finite number of seconds",
            field="profile" if problem.profile is not None else "cluster",
            hint="check the cost coefficients (seconds, bytes, FLOP/s in SI units) for values too large or too small.",
        )
    eval_ms = (clock() - eval_start) * 1000.0
    h_ms = (clock() - start) * 1000.0
    chosen: Assignment = hint
    stats = SolverStats(
        backend="heuristic",
        status="heuristic",
        wall_ms=h_ms,
        objective_s=h_time,
        bound_s=bound,
        trace=(TracePoint(h_ms, h_time, bound),),
    )
    if rescued is not None:
        stats = rescued

    def room_for(estimate_ms: float) -> str | None:
        """Why an optional phase expected to take ``estimate_ms`` does not start now, or None when it does."""
        left = deadline.left_ms() - finish_reserve_ms(tables)
        if deterministic or left >= SAFETY * estimate_ms:
            return None
        return f"the deadline leaves {max(left, 0.0):.0f} ms after the time kept for building and verifying the plan; it needs about {estimate_ms:.0f} ms here"

    static = None
    if not compare_static:
        skipped["static_baseline"] = "not asked for"
    elif (why := room_for(phase_ms("static", n))) is not None:
        skipped["static_baseline"] = f"not computed: {why}"
    else:
        static = best_static(tables)
        if static is None:
            skipped["static_baseline"] = "no static power-of-two layout fits the batch in memory"
        lap("static_ms")
    if not tight_now:
        if (why := room_for(tight_ms)) is None:
            parts = bound_parts(tables)
            if max(parts.values()) > bound:
                binding = max(parts, key=parts.__getitem__)
                bound = parts[binding]
                stats = replace(stats, bound_s=max(bound, stats.bound_s or 0.0))
            lap("tight_bound_ms")
        else:
            skipped["tighter_bounds"] = f"only the single-sample bound: {why}"
    reserve = reserve_ms(tables, eval_ms)
    upper = min(h_time, static[0].predicted_step_time_s) if static is not None else h_time
    solver_next = (
        rescued is None
        and choose_backend(tables, options.backend, deadline.left_ms(), backends, reserve) != "heuristic"
    )
    sized = size_bound_within(tables, upper, bound, deadline, reserve, deterministic, solver_next)
    if sized is not None:
        if sized > bound:
            bound, binding = sized, "group_sizes"
            stats = replace(stats, bound_s=max(bound, stats.bound_s or 0.0))
        lap("size_bound_ms")
    remaining_ms = deadline.left_ms()
    backend_name = (
        "heuristic" if rescued is not None else choose_backend(tables, options.backend, remaining_ms, backends, reserve)
    )
    skip = no_time_for(backend_name, remaining_ms - reserve, backends) if backend_name != "heuristic" else None
    if skip:
        stats = SolverStats(
            **{**stats.__dict__, "backend": backend_name, "status": "fallback", "fallback_reason": skip}
        )
    elif backend_name != "heuristic":
        # The solver starts from the best plan known: the heuristic's, or the static layout when faster.
        first, first_time = hint, h_time
        if static is not None and static[0].predicted_step_time_s < h_time * (1 - 1e-9):
            first, first_time = static[1], static[0].predicted_step_time_s
        chosen, stats = run_backend(
            tables,
            backend_name,
            backends,
            first,
            first_time,
            bound,
            deadline.due - reserve / 1000.0,
            stats,
            start,
            clock,
        )
        if first is not hint:
            stats = SolverStats(
                **{
                    **stats.__dict__,
                    "details": {**stats.details, "solver_start": f"static layout CP {static[0].degree}"},
                }
            )  # type: ignore[index]
        lap("solver_ms")
    chosen_time = stats.objective_s if stats.objective_s is not None else assignment_step_time(tables, chosen)
    if static is not None and static[0].predicted_step_time_s < chosen_time * (1 - 1e-9):
        # The static layout is a plan like any other: never return something slower.
        chosen = static[1]
        stats = SolverStats(
            **{**stats.__dict__, "details": {**stats.details, "chosen": f"static layout CP {static[0].degree}"}}
        )
    chosen = align_blocks(tables, chosen)
    reuse_deadline = None if deterministic else deadline.due
    reused, hint_reused = reuse_groups(tables, chosen, reuse_deadline), reuse_groups(tables, hint, reuse_deadline)
    if reused is not chosen or hint_reused is not hint:
        chosen, hint = reused, hint_reused
        lap("group_reuse_ms")
    result = build_plan(tables, chosen, stats, max(bound, stats.bound_s or 0.0), static[0] if static else None)
    result = replace(result, solver=honest_status(result.solver, result.predicted_step_time_s, result.lower_bound_s))
    lap("build_ms")
    report = verify(result, problem)
    lap("verify_ms")
    if not report.ok and chosen is not hint:
        stats = SolverStats(
            **{
                **stats.__dict__,
                "status": "fallback",
                "fallback_reason": "solver plan failed verification: " + report.violations[0],
            }
        )
        result = build_plan(tables, hint, stats, bound, static[0] if static else None)
        report = verify(result, problem)
    report.raise_if_failed()
    wall_ms = (clock() - start) * 1000.0
    if result.lower_bound_s > (bound + problem.cost_profile.step_constant) * (
        1 + 1e-12
    ):  # build_plan adds the per-step constant
        binding = f"{result.solver.backend} (proven by the solver)"
    final = SolverStats(
        **{
            **result.solver.__dict__,
            "wall_ms": wall_ms,
            "details": {
                **result.solver.details,
                "phases": phases,
                "bound": binding,
                "heuristic": strategies,
                **({"skipped": skipped} if skipped else {}),
            },
        }
    )
    return replace(result, solver=final)


def refuse_short_budget(problem: Problem, deadline: Deadline) -> None:
    """Raise a ProblemError on ``options.time_budget_ms`` when the budget asked for cannot cover the batch's
    fixed work on this machine, before any of it is done.

    Only then: the threshold is :func:`planning.fixed_work.problem_budget_ms`, the least this machine
    needs (LOW_SHARE of the estimate at the rates of its fastest calibration run), so a budget that
    the fixed work fits is not refused. The budget judged is the one asked for (the options', or the
    caller's deadline when that is longer), never what is left of it: a request that waited for a solve
    worker, or a caller that kept part of the budget back, is planned with the time left, not refused.
    The message names the estimate, the hint a budget that covers it with headroom."""
    asked_ms = max(problem.options.time_budget_ms, deadline.budget_ms)
    if asked_ms >= problem_budget_ms(problem):
        return
    expected = problem_estimate_ms(problem)
    raise ProblemError(
        f"is {asked_ms:.0f} ms, but the batch of {len(problem.batch)} samples on {problem.cluster.domain_size} ranks "
        f"needs about {expected:.0f} ms here (the cost tables, a first plan, building and verifying it), whatever else is skipped",
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
    note = f"{stats.backend} reported optimal, but the plan's {step_s:.9g} s is {100 * (step_s / bound_s - 1):.4f}% above the proven bound {bound_s:.9g} s"
    return replace(stats, status="feasible", details={**stats.details, "solver_claim": note})


SOLVER_MODULES = ("ortools.sat.python.cp_model", "highspy", "pulp")
"""Loaded once at start-up: a long-running service should not make its first requests pay the
solver libraries' import time (the planner's ``auto`` avoids CP-SAT while OR-Tools is not loaded)."""


def warm_up_service() -> list[str]:
    """Load the planner's compiled kernels and import the installed solver libraries and backends
    (for a long-running process, at start-up); returns the solver modules now loaded.

    Then everything loaded so far is frozen out of the cyclic collector (``gc.freeze``): code and
    libraries live as long as the process, and a full collection that walks them (60 to 130 ms once
    OR-Tools, HiGHS and PuLP are loaded, measured on the 2-core development machine) would stall every
    planning thread past its budget."""
    import gc
    import importlib

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
    gc.collect()
    gc.freeze()
    return loaded
