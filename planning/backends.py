"""Choosing and running an exact backend after the heuristic, and rescuing a batch the heuristic could not pack.

Backends come in as a mapping from name to :class:`solver_models.Backend` (the built-in ones by
default; tests and embedders pass their own). A backend is chosen from what it says of itself:
``available()`` (installed) and ``load_ms()`` (what loading its library would still cost here).
Every solve runs under :mod:`planning.solve_watch`: its answer is awaited until the solver's
deadline and no longer (status ``stopped`` then, and the plan found before it stands).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from optimizer.bounds.lower_bounds import memory_proof
from optimizer.costs.tables import CostTables
from optimizer.errors import InfeasibleError, PlannerError
from optimizer.plan.evaluate import assignment_step_time
from optimizer.plan.records import Assignment, SolverStats, TracePoint
from optimizer.verify.verifier import check_assignment
from planning.budget_policy import GRACE_MS, MIN_SEARCH_MS, MIN_SOLVER_MS, SolveWindow, reserve_ms
from planning.solve_watch import busy, solve_watched
from solver_models import whole_model_fits
from solver_models.base import Backend

Backends = Mapping[str, Backend]

AUTO_ORDER = ("cpsat", "highs", "cbc")
"""``auto``'s preference among installed backends: CP-SAT is the strongest here on both the
whole-problem model and the neighbourhoods; CBC's process start makes it the slowest to answer."""


def stopped_reason(name: str) -> str:
    return (
        f"{name} was stopped at the deadline ({GRACE_MS:.0f} ms after it, without an answer): "
        "the plan is the best found before it"
    )


def busy_reason(name: str) -> str:
    return (
        f"{name} is still running solves stopped at earlier deadlines in this process: not started again until they end"
    )


def _load_ms(backends: Backends, name: str) -> float:
    backend = backends.get(name)
    return backend.load_ms() if backend is not None else 0.0


def choose_backend(
    tables: CostTables, requested: str, remaining_ms: float, backends: Backends, reserve: float | None = None
) -> str:
    """The backend for ``requested``; ``auto`` picks by size and time left.

    ``auto``: the heuristic alone when less than MIN_SOLVER_MS would be left to a solver, or, for
    problems too large for one whole model, less than MIN_SEARCH_MS (a neighbourhood search needs a
    few rounds to pay off); else the first of AUTO_ORDER that is installed and whose loading leaves
    MIN_SOLVER_MS of solving.
    """
    if requested != "auto":
        return requested
    solver_ms = remaining_ms - (reserve_ms(tables) if reserve is None else reserve)
    if solver_ms < MIN_SOLVER_MS:
        return "heuristic"
    if solver_ms < MIN_SEARCH_MS and not whole_model_fits(tables):
        return "heuristic"
    for name in AUTO_ORDER:
        backend = backends.get(name)
        if (
            backend is not None
            and backend.available()
            and solver_ms - backend.load_ms() >= MIN_SOLVER_MS
            and not busy(name)
        ):
            return name
    return "heuristic"


def no_time_for(name: str, solver_ms: float, backends: Backends) -> str | None:
    """Why ``name`` cannot run in ``solver_ms`` milliseconds, or None when it can."""
    if solver_ms < MIN_SOLVER_MS:
        return f"no time left for {name} after the heuristic ({solver_ms:.0f} ms for the solver)"
    cost = _load_ms(backends, name)
    if cost and solver_ms - cost < MIN_SOLVER_MS:
        library = "OR-Tools" if name == "cpsat" else "PuLP"
        return (
            f"{library} is not loaded in this process yet (about {cost:.0f} ms, once) and only {solver_ms:.0f} ms "
            "are left for the solver: give a larger budget, use --backend highs, or plan from a running service"
        )
    return None


def run_backend(
    tables: CostTables,
    name: str,
    backends: Backends,
    hint: Assignment,
    h_time: float,
    bound: float,
    window: SolveWindow,
    stats: SolverStats,
    start: float,
    clock: Callable[[], float],
) -> tuple[Assignment, SolverStats]:
    """Backend ``name`` started from ``hint`` until ``window.due`` (awaited until ``window.hard_stop``);
    its answer only when checked valid and better."""
    trace = list(stats.trace)

    def on_improvement(elapsed_ms: float, objective: float, solver_bound: float | None) -> None:
        trace.append(TracePoint((clock() - start) * 1000.0, objective, solver_bound))

    backend = backends.get(name)
    if backend is None or not backend.available():
        why = f"backend {name!r} is not installed (pip install 'dhp-planner[solver]')"
        return hint, replace(stats, backend=name, status="fallback", fallback_reason=why)
    if busy(name):
        return hint, replace(stats, backend=name, status="fallback", fallback_reason=busy_reason(name))
    watched = solve_watched(name, backend, tables, hint, window.due, window.hard_stop, on_improvement, clock)
    if watched.stopped:
        return hint, replace(
            stats,
            backend=name,
            status="stopped",
            details={**stats.details, "stopped_after_ms": round(watched.waited_ms, 3)},
            fallback_reason=stopped_reason(name),
        )
    result = watched.result
    if result is None:  # a solver crash must never lose the heuristic plan
        exc = watched.error
        why = f"{type(exc).__name__}: {exc}" if exc is not None else f"{name} returned nothing"
        return hint, replace(stats, backend=name, status="fallback", fallback_reason=why)
    answered = replace(
        stats,
        backend=name,
        status=result.status,
        objective_s=h_time,
        bound_s=max(bound, result.bound_s or 0.0),
        trace=tuple(trace),
        details=dict(result.details),
    )
    if result.assignment is None:
        why = result.message or f"{name} returned no solution ({result.status})"
        return hint, replace(answered, status="fallback", fallback_reason=why)
    check = check_assignment(tables.problem, result.assignment)
    if not check.ok:
        return hint, replace(
            answered, status="fallback", fallback_reason=f"{name} answer invalid: {check.violations[0]}"
        )
    if check.micro_batches_s >= h_time * (1 - 1e-9):
        return hint, replace(answered, fallback_reason=f"{name} found nothing better than its starting plan")
    return result.assignment, replace(answered, objective_s=check.micro_batches_s)


def rescue(
    tables: CostTables,
    error: InfeasibleError,
    backends: Backends,
    window: SolveWindow,
    start: float,
    clock: Callable[[], float],
) -> tuple[Assignment, SolverStats]:
    """A plan from the whole exact model, solved until ``window.due``, when the heuristic found none.

    The heuristic's InfeasibleError stands only when infeasibility is proven: by counting memory
    (:func:`optimizer.bounds.lower_bounds.memory_proof`) or by the whole exact model answering
    ``infeasible`` on a homogeneous cluster (there it holds every plan). Otherwise the model's plan is
    returned, or, when it finds none in time, a PlannerError says that no plan was found and that
    infeasibility is not proven.
    """
    if memory_proof(tables):
        raise error
    options = tables.problem.options
    left_ms = (window.due - clock()) * 1000.0
    name = choose_backend(tables, "auto" if options.backend == "heuristic" else options.backend, left_ms, backends, 0.0)
    backend = backends.get(name) if name != "heuristic" else None
    why: str | None = None
    if not whole_model_fits(tables):
        why = "the batch is too large for the whole exact model"
    elif backend is None or not backend.available():
        why = (
            f"no exact backend could run in the {left_ms:.0f} ms left"
            if name in ("heuristic", "auto")
            else f"backend {name!r} is not installed"
        )
    elif busy(name):
        why = busy_reason(name)
    else:
        why = no_time_for(name, left_ms, backends)
    result = None
    if why is None and backend is not None:
        watched = solve_watched(name, backend, tables, None, window.due, window.hard_stop, None, clock)
        result = watched.result
        if watched.stopped:
            why = f"the whole exact model ({name}) had not answered at the deadline (stopped there)"
        elif watched.error is not None:  # a solver crash must not hide the heuristic's explanation
            why = f"{name} failed: {type(watched.error).__name__}: {watched.error}"
    if result is not None and result.assignment is not None and check_assignment(tables.problem, result.assignment).ok:
        objective = assignment_step_time(tables, result.assignment)
        elapsed = (clock() - start) * 1000.0
        return result.assignment, SolverStats(
            backend=name,
            status=result.status,
            wall_ms=elapsed,
            objective_s=objective,
            bound_s=result.bound_s,
            trace=(TracePoint(elapsed, objective, result.bound_s),),
            details={**result.details, "rescue": f"the heuristic found no plan ({error.message}); the whole model did"},
        )
    if result is not None and result.status == "infeasible" and tables.homogeneous:
        raise InfeasibleError(
            f"{error.message}; the whole exact model ({name}) proves that no plan exists",
            field=error.field,
            hint=error.hint,
        )
    if why is None and result is not None:
        why = f"the whole exact model ({name}) found no plan in time ({result.status})"
    raise PlannerError(
        f"no plan found within the budget: the heuristic found none ({error.message}) and {why}; "
        "infeasibility is not proven",
        field="options.time_budget_ms",
        hint="give a larger budget (options.time_budget_ms) with an exact backend installed "
        "(pip install 'dhp-planner[solver]'), "
        "or allow more micro-batches (options.max_micro_batches).",
    )
