"""Orchestration: the heuristic first, then an exact backend for the rest of the budget.

``plan(problem)`` always returns a verified plan or raises a domain error:

1. build the cost tables and the lower bound;
2. run the heuristic (it answers in milliseconds and is the fallback);
3. if the options ask for it and time is left, run an exact backend from ``solver_models`` with
   the heuristic's assignment as a full hint, until the deadline;
4. verify the candidates independently and keep the best valid one; a solver failure, time-out
   or invalid answer is recorded as the fallback reason, never raised;
5. attach the best static power-of-two layout's step time for comparison.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from optimizer import communicators
from optimizer.baselines import best_static
from optimizer.bounds import bound_parts
from optimizer.costs import CostTables
from optimizer.errors import InfeasibleError, PlannerError
from optimizer.evaluate import assignment_step_time, build_plan
from optimizer.gc_pause import collector_paused, collector_running
from optimizer.plan import Assignment, Plan, SolverStats, TracePoint
from optimizer.problem import Problem
from optimizer.strategies import heuristic_plan
from optimizer.verify import check_assignment, verify
from optimizer.warm import warm_up

# Share of the budget the heuristic may use when an exact backend follows.
HEURISTIC_SHARE = 0.75
# Below this many milliseconds left, no exact backend is started.
MIN_SOLVER_MS = 20.0
# Milliseconds kept back from the solver for checking its answer, building and verifying the plan:
# a constant plus RESERVE_EVALS times what one evaluation of the heuristic's plan took (the work
# after the solver is about five such passes: measured 0.6 ms of building and verifying after a
# 0.15 ms evaluation at 512 samples, 105 ms after 15 ms at 65,536; eight leave room for a machine
# busy with other work).
RESERVE_MS = 3.0
RESERVE_EVALS = 8.0
RESERVE_MS_PER_SAMPLE = 0.005
# Expected heuristic milliseconds per sample (measured 0.0015 to 0.003 from 512 to 65,536 samples);
# a budget below heuristic + reserve + MIN_SOLVER_MS leaves nothing to a solver, so the heuristic
# gets the whole budget instead of HEURISTIC_SHARE.
HEURISTIC_MS_PER_SAMPLE = 0.01
# Least solver milliseconds for which ``auto`` starts a neighbourhood search on a large problem.
MIN_SEARCH_MS = 60.0
# Milliseconds loading each backend's library costs in a process that has not loaded it yet (numpy
# already loaded, as it is when a plan runs). Measured on the 2-core development machine in fresh
# processes: OR-Tools' CP-SAT 184 to 216 ms idle (357 to 661 ms seen on a busy machine), PuLP with
# highspy 26 to 62 ms; the figures below leave room for a busy machine. ``auto`` never starts a
# backend whose loading would not leave MIN_SOLVER_MS of solving in the budget.
IMPORT_MS = {"cpsat": 400.0, "highs": 100.0, "cbc": 100.0}
# The module whose presence in ``sys.modules`` means a backend's library is loaded.
LIBRARY_MODULE = {"cpsat": "ortools.sat.python.cp_model", "highs": "pulp", "cbc": "pulp"}
# Status "optimal" promises a step time within this share of a proven lower bound (the exact
# models round times up to 0.1 us units, so a proof is never closer than that rounding).
OPTIMAL_GAP = 1e-4


def load_ms(name: str) -> float:
    """Milliseconds loading backend ``name``'s library would still cost in this process (0 when loaded)."""
    import sys

    module = LIBRARY_MODULE.get(name)
    return 0.0 if module is None or module in sys.modules else IMPORT_MS.get(name, 0.0)


def reserve_ms(tables: CostTables, eval_ms: float | None = None) -> float:
    """Time the planner needs after the solver returns (from one evaluation's time when known)."""
    if eval_ms is None:
        return RESERVE_MS + RESERVE_MS_PER_SAMPLE * tables.n_samples
    return RESERVE_MS + RESERVE_EVALS * eval_ms


def choose_backend(tables: CostTables, requested: str, remaining_ms: float, reserve: float | None = None) -> str:
    """The backend for ``requested``; ``auto`` picks by size and time left.

    ``auto``: the heuristic alone when less than MIN_SOLVER_MS would be left to a solver, or, for
    problems too large for one whole model, less than MIN_SEARCH_MS (a neighbourhood search needs
    a few rounds to pay off); else CP-SAT (the strongest here on both the whole-problem model and
    the neighbourhoods), unless OR-Tools is not loaded yet and loading it would eat the budget,
    then HiGHS, then CBC (whose process start makes it the slowest to answer).
    """
    if requested != "auto":
        return requested
    solver_ms = remaining_ms - (reserve_ms(tables) if reserve is None else reserve)
    if solver_ms < MIN_SOLVER_MS:
        return "heuristic"
    from solver_models import available_backends
    from solver_models.lns import FULL_MODEL_PAIRS, full_model_pairs

    if solver_ms < MIN_SEARCH_MS and full_model_pairs(tables) > FULL_MODEL_PAIRS:
        return "heuristic"

    have = available_backends()  # finds the libraries without loading them
    for name in ("cpsat", "highs", "cbc"):
        if name in have and solver_ms - load_ms(name) >= MIN_SOLVER_MS:
            return name
    return "heuristic"


def plan(problem: Problem, *, compare_static: bool = True, clock: Callable[[], float] = time.perf_counter) -> Plan:
    """The verified plan of ``problem`` (see the module docstring)."""
    warm_up()  # once per process, before the budget's clock starts (optimizer.warm)
    with collector_paused():
        return _plan(problem, compare_static, clock)


def _plan(problem: Problem, compare_static: bool, clock: Callable[[], float]) -> Plan:
    start = clock()
    options = problem.options
    deadline = start + options.time_budget_ms / 1000.0
    phases: dict[str, float] = {}
    mark = start

    def lap(name: str) -> None:
        nonlocal mark
        now = clock()
        phases[name] = round((now - mark) * 1000.0, 3)
        mark = now

    tables = CostTables.build(problem)
    lap("tables_ms")
    parts = bound_parts(tables)
    binding = max(parts, key=parts.__getitem__)
    bound = parts[binding]
    lap("bound_ms")
    expected_ms = HEURISTIC_MS_PER_SAMPLE * tables.n_samples + reserve_ms(tables) + MIN_SOLVER_MS
    solver_follows = options.backend != "heuristic" and options.time_budget_ms >= expected_ms
    if solver_follows and options.backend == "auto":
        # auto starts no neighbourhood search with under MIN_SEARCH_MS left: then the heuristic may use that time.
        from solver_models.lns import FULL_MODEL_PAIRS, full_model_pairs

        after_ms = options.time_budget_ms * (1 - HEURISTIC_SHARE) - reserve_ms(tables)
        solver_follows = after_ms >= MIN_SEARCH_MS or full_model_pairs(tables) <= FULL_MODEL_PAIRS
    h_deadline = start + options.time_budget_ms * (HEURISTIC_SHARE if solver_follows else 0.9) / 1000.0
    rescued: SolverStats | None = None
    try:
        hint = heuristic_plan(tables, deadline=h_deadline, bound=bound)
    except InfeasibleError as exc:
        # The heuristic found no packing; on a small problem the whole exact model may still find one.
        with collector_running():
            hint, rescued = _rescue(tables, exc, deadline - reserve_ms(tables) / 1000.0, start, clock)
    lap("heuristic_ms")
    eval_start = clock()
    h_time = assignment_step_time(tables, hint)
    eval_ms = (clock() - eval_start) * 1000.0
    h_ms = (clock() - start) * 1000.0
    chosen: Assignment = hint
    stats = SolverStats(backend="heuristic", status="heuristic", wall_ms=h_ms, objective_s=h_time, bound_s=bound,
                        trace=(TracePoint(h_ms, h_time, bound),))
    if rescued is not None:
        stats = rescued

    static = best_static(tables) if compare_static else None
    lap("static_ms")
    remaining_ms = (deadline - clock()) * 1000.0
    reserve = reserve_ms(tables, eval_ms)
    backend_name = "heuristic" if rescued is not None else choose_backend(tables, options.backend, remaining_ms, reserve)
    skip = _no_time_for(backend_name, remaining_ms - reserve) if backend_name != "heuristic" else None
    if skip:
        stats = SolverStats(**{**stats.__dict__, "backend": backend_name, "status": "fallback", "fallback_reason": skip})
    elif backend_name != "heuristic":
        # The solver starts from the best plan known: the heuristic's, or the static layout when faster.
        first, first_time = hint, h_time
        if static is not None and static[0].predicted_step_time_s < h_time * (1 - 1e-9):
            first, first_time = static[1], static[0].predicted_step_time_s
        solver_deadline = deadline - reserve / 1000.0
        with collector_running():
            chosen, stats = _run_backend(tables, backend_name, first, first_time, bound, solver_deadline, stats, start, clock)
        if first is not hint:
            stats = SolverStats(**{**stats.__dict__, "details": {**stats.details, "solver_start": f"static layout CP {static[0].degree}"}})  # type: ignore[index]
        lap("solver_ms")
    chosen_time = stats.objective_s if stats.objective_s is not None else assignment_step_time(tables, chosen)
    if static is not None and static[0].predicted_step_time_s < chosen_time * (1 - 1e-9):
        # The static layout is a plan like any other: never return something slower.
        chosen = static[1]
        stats = SolverStats(**{**stats.__dict__, "details": {**stats.details, "chosen": f"static layout CP {static[0].degree}"}})
    if communicators.active(problem):
        # Move groups onto the job's existing communicators (options.group_reuse); see optimizer.communicators.
        chosen, hint = communicators.adapt(tables, chosen), communicators.adapt(tables, hint)
        lap("group_reuse_ms")
    result = build_plan(tables, chosen, stats, max(bound, stats.bound_s or 0.0), static[0] if static else None)
    result = replace(result, solver=honest_status(result.solver, result.predicted_step_time_s, result.lower_bound_s))
    lap("build_ms")
    report = verify(result, problem)
    lap("verify_ms")
    if not report.ok and chosen is not hint:
        stats = SolverStats(**{**stats.__dict__, "status": "fallback", "fallback_reason": "solver plan failed verification: " + report.violations[0]})
        result = build_plan(tables, hint, stats, bound, static[0] if static else None)
        report = verify(result, problem)
    report.raise_if_failed()
    wall_ms = (clock() - start) * 1000.0
    if result.lower_bound_s > bound * (1 + 1e-12):
        binding = f"{result.solver.backend} (proven by the solver)"
    final = SolverStats(**{**result.solver.__dict__, "wall_ms": wall_ms, "details": {**result.solver.details, "phases": phases, "bound": binding}})
    return replace(result, solver=final)


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


def memory_proof(tables: CostTables) -> bool:
    """Whether the batch provably cannot fit: more tokens than every rank of every allowed micro-batch
    holds, or a sample longer than the largest group of the roomiest ranks holds."""
    limit = min(tables.problem.options.micro_batch_limit, tables.n_samples)
    capacity = tables.rank_capacity
    largest = float(np.sort(capacity)[::-1][: int(tables.degrees.max())].sum())
    return bool(tables.lengths.sum() > limit * capacity.sum() * (1 + 1e-9) or tables.lengths.max() > largest * (1 + 1e-9))


def _rescue(tables: CostTables, error: InfeasibleError, deadline: float, start: float, clock: Callable[[], float]) -> tuple[Assignment, SolverStats]:
    """A plan from the whole exact model when the heuristic found none.

    The heuristic's InfeasibleError stands only when infeasibility is proven: by counting memory
    (:func:`memory_proof`) or by the whole exact model answering ``infeasible`` on a homogeneous
    cluster (there it holds every plan). Otherwise the model's plan is returned, or, when it finds
    none in time, a PlannerError says that no plan was found and that infeasibility is not proven.
    """
    if memory_proof(tables):
        raise error
    options = tables.problem.options
    from solver_models import get_backend
    from solver_models.lns import FULL_MODEL_PAIRS, full_model_pairs

    left_ms = (deadline - clock()) * 1000.0
    name = choose_backend(tables, "auto" if options.backend == "heuristic" else options.backend, left_ms, 0.0)
    backend = get_backend(name) if name != "heuristic" else None
    why: str | None = None
    if full_model_pairs(tables) > FULL_MODEL_PAIRS:
        why = "the batch is too large for the whole exact model"
    elif backend is None or not backend.available():
        why = f"no exact backend could run in the {left_ms:.0f} ms left" if name in ("heuristic", "auto") else f"backend {name!r} is not installed"
    else:
        why = _no_time_for(name, left_ms)
    result = None
    if why is None:
        try:
            result = backend.solve(tables, options, None, deadline, None)  # type: ignore[union-attr, arg-type]
        except Exception as exc:  # a solver crash must not hide the heuristic's explanation
            why = f"{name} failed: {type(exc).__name__}: {exc}"
    if result is not None and result.assignment is not None and check_assignment(tables.problem, result.assignment).ok:
        objective = assignment_step_time(tables, result.assignment)
        elapsed = (clock() - start) * 1000.0
        return result.assignment, SolverStats(backend=name, status=result.status, wall_ms=elapsed, objective_s=objective, bound_s=result.bound_s,
                                              trace=(TracePoint(elapsed, objective, result.bound_s),),
                                              details={**result.details, "rescue": f"the heuristic found no plan ({error.message}); the whole model did"})
    if result is not None and result.status == "infeasible" and tables.homogeneous:
        raise InfeasibleError(f"{error.message}; the whole exact model ({name}) proves that no plan exists", field=error.field, hint=error.hint)
    if why is None and result is not None:
        why = f"the whole exact model ({name}) found no plan in time ({result.status})"
    raise PlannerError(
        f"no plan found within the budget: the heuristic found none ({error.message}) and {why}; infeasibility is not proven",
        field="options.time_budget_ms",
        hint="give a larger budget (options.time_budget_ms) with an exact backend installed (pip install 'dhp-planner[solver]'), "
             "or allow more micro-batches (options.max_micro_batches).",
    )


def _no_time_for(name: str, solver_ms: float) -> str | None:
    """Why ``name`` cannot run in ``solver_ms`` milliseconds, or None when it can."""
    if solver_ms < MIN_SOLVER_MS:
        return f"no time left for {name} after the heuristic ({solver_ms:.0f} ms for the solver)"
    cost = load_ms(name)
    if cost and solver_ms - cost < MIN_SOLVER_MS:
        library = "OR-Tools" if name == "cpsat" else "PuLP"
        return (f"{library} is not loaded in this process yet (about {cost:.0f} ms, once) and only {solver_ms:.0f} ms "
                "are left for the solver: give a larger budget, use --backend highs, or plan from a running service")
    return None


def _run_backend(tables: CostTables, name: str, hint: Assignment, h_time: float, bound: float, deadline: float,
                 stats: SolverStats, start: float, clock: Callable[[], float]) -> tuple[Assignment, SolverStats]:
    from solver_models import get_backend

    trace = list(stats.trace)

    def on_improvement(elapsed_ms: float, objective: float, solver_bound: float | None) -> None:
        trace.append(TracePoint((clock() - start) * 1000.0, objective, solver_bound))

    backend = get_backend(name)
    if backend is None or not backend.available():
        return hint, SolverStats(**{**stats.__dict__, "backend": name, "status": "fallback", "fallback_reason": f"backend {name!r} is not installed (pip install 'dhp-planner[solver]')"})
    try:
        result = backend.solve(tables, tables.problem.options, hint, deadline, on_improvement)
    except Exception as exc:  # a solver crash must never lose the heuristic plan
        return hint, SolverStats(**{**stats.__dict__, "backend": name, "status": "fallback", "fallback_reason": f"{type(exc).__name__}: {exc}"})
    best_bound = max(bound, result.bound_s or 0.0)
    base = dict(backend=name, status=result.status, objective_s=h_time, bound_s=best_bound, trace=tuple(trace), details=dict(result.details))
    if result.assignment is None:
        return hint, SolverStats(**{**stats.__dict__, **base, "status": "fallback", "fallback_reason": result.message or f"{name} returned no solution ({result.status})"})
    check = check_assignment(tables.problem, result.assignment)
    if not check.ok:
        return hint, SolverStats(**{**stats.__dict__, **base, "status": "fallback", "fallback_reason": f"{name} answer invalid: {check.violations[0]}"})
    if check.step_time_s >= h_time * (1 - 1e-9):
        return hint, SolverStats(**{**stats.__dict__, **base, "fallback_reason": f"{name} found nothing better than its starting plan"})
    return result.assignment, SolverStats(**{**stats.__dict__, **base, "objective_s": check.step_time_s})
