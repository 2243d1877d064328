"""Choosing and running an exact backend after the heuristic, and rescuing a batch the heuristic could not pack.

Backends come in as a mapping from name to :class:`solver_models.Backend` (the built-in ones by
default; tests and embedders pass their own). A backend is chosen from what it says of itself:
``available()`` (installed) and ``load_ms()`` (what loading its library would still cost here).
Every solve runs under :mod:`planning.solve_watch`: its answer is awaited until the solver's
deadline and no longer (status ``stopped`` then, and the plan found before it stands).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

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


def stopped_reason(name: str, waited_ms: float | None = None) -> str:
    waited = f"no answer after {waited_ms:.0f} ms, " if waited_ms is not None else "no answer "
    return (
        f"{name} was stopped at the deadline ({waited}{GRACE_MS:.0f} ms past it): the plan is the best found before it"
    )


def busy_reason(name: str) -> str:
    return (
        f"{name} is still running solves stopped at earlier deadlines in this process: not started again until they end"
    )


def _load_ms(backends: Backends, name: str) -> float:
    backend = backends.get(name)
    return backend.load_ms() if backend is not None else 0.0


LIBRARIES = {"cpsat": "OR-Tools", "highs": "highspy", "cbc": "PuLP"}
"""The library each built-in backend loads on its first solve in a process."""


@dataclass(frozen=True)
class NoSolve:
    """Why no exact backend starts, with its figures; ``need_ms``: the solver milliseconds under which one
    would have started (its library's loading included), None when more time would not start one;
    ``instead``: another fix than more time, when there is one."""

    why: str
    need_ms: float | None = None
    instead: str | None = None


@dataclass(frozen=True)
class Choice:
    """The backend chosen for ``requested`` (``heuristic``: none) and, when ``auto`` chose none, why (``skip``)."""

    name: str
    skip: NoSolve | None = None


def choose_backend(
    tables: CostTables,
    requested: str,
    remaining_ms: float,
    backends: Backends,
    reserve: float | None = None,
    deterministic: bool = False,
) -> Choice:
    """The backend for ``requested``; ``auto`` picks by size and time left.

    ``auto``: the heuristic alone when less than MIN_SOLVER_MS would be left to a solver, or, for
    problems too large for one whole model, less than MIN_SEARCH_MS (a neighbourhood search needs a
    few rounds to pay off); else the first of AUTO_ORDER that is installed and whose loading leaves
    MIN_SOLVER_MS of solving. When it picks the heuristic alone, the choice says why. ``deterministic``:
    every library counts as not loaded yet (whether it is loaded is the process's history, not the input),
    and only backends with deterministic limits qualify (one that stops on the clock answers by the
    machine's speed).
    """
    if requested != "auto":
        return Choice(requested)
    kept = reserve_ms(tables) if reserve is None else reserve
    solver_ms = remaining_ms - kept
    left = (
        f"auto found {max(remaining_ms, 0.0):.0f} ms left, {kept:.0f} ms of them kept for building and verifying "
        f"the plan: {solver_ms:.0f} ms for a solver"
        if solver_ms >= 0
        else f"auto found {max(remaining_ms, 0.0):.0f} ms left, less than the {kept:.0f} ms kept for building and "
        "verifying the plan: none for a solver"
    )
    whole = whole_model_fits(tables)

    def load_ms(backend: Backend) -> float:
        # a backend may say what loading costs a process that has not loaded it (cold_load_ms); one that
        # does not is counted by what load_ms says now
        cold = getattr(backend, "cold_load_ms", backend.load_ms)
        return float(cold()) if deterministic else backend.load_ms()

    def repeatable(backend: Backend) -> bool:
        return not deterministic or bool(getattr(backend, "deterministic_limits", False))

    loads = sorted(
        (load_ms(b), name)
        for name in AUTO_ORDER
        if (b := backends.get(name)) is not None and b.available() and not busy(name) and repeatable(b)
    )
    # The solver time that lets auto start one: its least, and the quickest to load of those that can start.
    need = max(MIN_SOLVER_MS if whole else MIN_SEARCH_MS, MIN_SOLVER_MS + loads[0][0]) if loads else None
    loading = (
        f" (and the quickest to load, {loads[0][1]}, would first load {LIBRARIES.get(loads[0][1], 'its library')}: "
        f"about {loads[0][0]:.0f} ms)"
        if loads and loads[0][0]
        else ""
    )
    if solver_ms < MIN_SOLVER_MS:
        why = f"{left}, and a solve needs at least {MIN_SOLVER_MS:.0f} ms{loading}"
        return Choice("heuristic", NoSolve(why, need))
    if solver_ms < MIN_SEARCH_MS and not whole:
        why = (
            f"{left}; the batch is too large for one whole model, and a neighbourhood search needs at least "
            f"{MIN_SEARCH_MS:.0f} ms{loading}"
        )
        return Choice("heuristic", NoSolve(why, need))
    refused = []
    for name in AUTO_ORDER:
        backend = backends.get(name)
        if backend is None or not backend.available():
            refused.append(f"{name} is not installed")
        elif not repeatable(backend):
            refused.append(f"{name} stops on the clock, so its plans are not deterministic")
        elif busy(name):
            refused.append(f"{name} is still running solves stopped at earlier deadlines")
        elif solver_ms - load_ms(backend) < MIN_SOLVER_MS:
            refused.append(
                f"{name} would first load {LIBRARIES.get(name, 'its library')} (about {load_ms(backend):.0f} ms)"
            )
        else:
            return Choice(name)
    why = f"{left}, and {', '.join(refused)}"
    if loads:  # more time lets the quickest to load start (a running service's loaded libraries, unless deterministic)
        instead = None if deterministic else "plan from a running service (it loads the solvers at start-up)"
        return Choice("heuristic", NoSolve(why, need, instead))
    if all("not installed" in r for r in refused):
        return Choice("heuristic", NoSolve(why, instead="install one: pip install 'dhp-planner[solver]'"))
    if deterministic and all("not installed" in r or "on the clock" in r for r in refused):
        return Choice(
            "heuristic",
            NoSolve(
                why,
                instead="install OR-Tools (pip install 'dhp-planner[solver]'), or ask for a backend by name "
                "(its plan then depends on the machine's speed)",
            ),
        )
    return Choice("heuristic", NoSolve(why, instead="plan again once the stopped solves have ended"))


def no_time_for(name: str, solver_ms: float, backends: Backends, deterministic: bool = False) -> NoSolve | None:
    """Why ``name`` cannot run in ``solver_ms`` milliseconds, or None when it can (``deterministic``: loading
    counts nothing: the backend was asked for by name, or ``auto`` chose it counting its library unloaded)."""
    cost = 0.0 if deterministic else _load_ms(backends, name)
    if solver_ms < MIN_SOLVER_MS:
        loading = f" after loading {LIBRARIES.get(name, 'its library')} (about {cost:.0f} ms)" if cost else ""
        return NoSolve(
            f"{name} had {max(solver_ms, 0.0):.0f} ms to solve in, and a solve needs at least {MIN_SOLVER_MS:.0f} ms"
            + loading,
            MIN_SOLVER_MS + cost,
        )
    if cost and solver_ms - cost < MIN_SOLVER_MS:
        loaded = [
            other
            for other in AUTO_ORDER
            if other != name and (b := backends.get(other)) is not None and b.available() and not b.load_ms()
        ]
        instead = f"ask for backend {loaded[0]} (loaded already), or " if loaded else ""
        return NoSolve(
            f"{LIBRARIES.get(name, 'its library')} is not loaded in this process yet (about {cost:.0f} ms, once) "
            f"and {name} had only {max(solver_ms, 0.0):.0f} ms",
            MIN_SOLVER_MS + cost,
            f"{instead}plan from a running service (it loads the solvers at start-up)",
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
            fallback_reason=stopped_reason(name, watched.waited_ms),
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
        why = (
            f"{name} found nothing better than its starting plan ({h_time:.6g} s of micro-batches) "
            f"in {watched.waited_ms:.0f} ms"
        )
        return hint, replace(answered, fallback_reason=why)
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
    choice = choose_backend(
        tables, "auto" if options.backend == "heuristic" else options.backend, left_ms, backends, 0.0
    )
    name = choice.name
    backend = backends.get(name) if name != "heuristic" else None
    why: str | None = None
    if not whole_model_fits(tables):
        why = "the batch is too large for the whole exact model"
    elif backend is None or not backend.available():
        why = (
            (choice.skip.why if choice.skip else f"no exact backend could run in the {left_ms:.0f} ms left")
            if name in ("heuristic", "auto")
            else f"backend {name!r} is not installed"
        )
    elif busy(name):
        why = busy_reason(name)
    elif (short := no_time_for(name, left_ms, backends)) is not None:
        why = short.why
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
