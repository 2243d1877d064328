"""CP-SAT (OR-Tools) on the slot model of :mod:`solver_models.formulation`.

The variables, rows and objective come from :class:`~solver_models.formulation.SlotModel` (its
docstring numbers the constraints); this module only translates them, row by row. Times are integers of
``formulation.UNIT`` seconds; the incumbent is given as a full hint; the time limit is what the
caller's deadline leaves after the build; ``solver_workers`` caps the threads; with
``deterministic`` the search is interleaved under a deterministic time limit (still capped by wall
time). A solution callback reports each improving solution. The bound is CP-SAT's
``best_objective_bound``, not the status: only a closed gap is a proof.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from optimizer.costs.tables import CostTables
from optimizer.plan.records import Assignment
from optimizer.problem.options import PlanOptions
from solver_models.base import ImprovementCallback, SolveResult, register
from solver_models.formulation import SlotModel
from solver_models.lns import ModelResult, improve
from solver_models.stop import Stopped, StopSignal, check_stop, current_stop, stop_requested

DETERMINISTIC_TIME_SHARE = 0.1
"""Deterministic mode: CP-SAT's deterministic time limit as a share of the solve's time limit. Chosen by
hand with DETERMINISTIC_WALL_LIMITS: the wall-clock cap lies fifty times further (5 / 0.1), so the
deterministic limit, never the clock, ends the search on a machine up to fifty times slower than
CP-SAT's estimate of its deterministic time."""
DETERMINISTIC_WALL_LIMITS = 5.0
"""Deterministic mode: CP-SAT's wall-clock limit in time limits of the solve, a safety net only (see
DETERMINISTIC_TIME_SHARE). Another quantity than the planner's wait for a deterministic answer
(``planning.budget_policy.DETERMINISTIC_WAIT_BUDGETS``), which counts budgets after the solver's
deadline and lies above the longest these caps allow a whole deterministic solve."""


@functools.cache
def _classes() -> tuple[type, type]:
    """The model and solution-callback classes, made once (OR-Tools loads on first use).

    The model is OR-Tools' ``CpModel`` without the camel-case aliases it sets on every instance:
    each alias is a closure over one of the instance's own bound methods, about 60 reference cycles
    per model that only the cyclic collector can free. One model per neighbourhood round left tens
    of thousands of such objects, and the collection that frees them (30 to 40 ms, measured on the
    2-core development machine) fell on the end of the plan, past its budget. Only the snake-case
    methods are used here."""
    from ortools.sat.python import cp_model

    class Model(cp_model.CpModel):  # type: ignore[misc]
        def _add_pre_pep8_methods(self) -> None:
            pass

    class Callback(cp_model.CpSolverSolutionCallback):  # type: ignore[misc]
        def __init__(self, signal: StopSignal | None, on_solution: Callable[[int, int | None], None] | None) -> None:
            super().__init__()
            self.signal = signal
            self.on_solution = on_solution

        def on_solution_callback(self) -> None:
            if self.signal is not None and self.signal.is_set():  # asked before the search had started
                self.stop_search()
            if self.on_solution is not None:
                self.on_solution(int(round(self.objective_value)), int(round(self.best_objective_bound)))

    return Model, Callback


def _name(key: tuple) -> str:
    return key[0] + "_".join(str(k) for k in key[1:])


def solve_model(
    model: SlotModel,
    time_limit_s: float,
    options: PlanOptions,
    on_solution: Callable[[int, int | None], None] | None = None,
) -> ModelResult:
    """Solve one slot model with CP-SAT within ``time_limit_s`` seconds of this call (building the
    model included); ends early when this thread's solve is asked to stop (:mod:`solver_models.stop`)."""
    called = time.perf_counter()  # loading OR-Tools (the first time) counts too
    from ortools.sat.python import cp_model

    model_class, callback_class = _classes()
    cp = model_class()
    var: dict[Any, Any] = {}
    try:
        for k, (key, low, high) in enumerate(model.variables()):
            check_stop(k)
            var[key] = cp.new_bool_var(_name(key)) if high == 1 and low == 0 else cp.new_int_var(low, high, _name(key))
        for k, row in enumerate(model.rows()):
            check_stop(k)
            expr = sum(c * var[key] for key, c in row.terms)
            cp.add(expr == row.rhs if row.sense == "==" else expr <= row.rhs if row.sense == "<=" else expr >= row.rhs)
    except Stopped as exc:
        return ModelResult("timeout", None, None, None, None, message=str(exc))
    cp.minimize(sum(c * var[key] for key, c in model.objective()))
    y = [var[("y", s)] for s in range(model.n_slots)]
    x = {(q, s): var[("x", q, s)] for q, s, _ in model.arcs}
    t_mb = [var[("T", m)] for m in range(model.n_mb)]
    u_mb = [var[("U", m)] for m in range(model.n_mb)] if model.tiebreak else []
    if model.hint_x:
        for s, v in enumerate(model.hint_y):
            cp.add_hint(y[s], v)
        for key, x_var in x.items():
            cp.add_hint(x_var, model.hint_x.get(key, 0))
        for m, v in enumerate(model.hint_t):
            cp.add_hint(t_mb[m], max(v, model.floor[m]))
            if model.tiebreak:
                cp.add_hint(u_mb[m], v)

    left_s = time_limit_s if options.deterministic else time_limit_s - (time.perf_counter() - called)
    signal = current_stop()
    if (left_s < 0.001 and not options.deterministic) or stop_requested():
        return ModelResult("timeout", None, None, None, None, message="no time left after building the model")
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.max_time_in_seconds = max(0.001, left_s)
    params.num_workers = options.solver_workers
    params.log_search_progress = False
    if hasattr(params, "catch_sigint_signal"):
        params.catch_sigint_signal = False
    if model.tiebreak:
        # Neighbourhoods are small and need a good answer fast, not a proof: no presolve, no LP.
        params.cp_model_presolve = False
        params.linearization_level = 0
    if options.deterministic:
        params.interleave_search = True
        # The deterministic limit ends the search; the wall-clock limit is only a safety net.
        params.max_deterministic_time = max(0.001, DETERMINISTIC_TIME_SHARE * time_limit_s)
        params.max_time_in_seconds = max(0.001, DETERMINISTIC_WALL_LIMITS * time_limit_s)

    unregister = signal.on_stop(solver.stop_search) if signal is not None else None
    try:
        status = solver.solve(cp, callback_class(signal, on_solution))
    finally:
        if unregister is not None:
            unregister()
    name = {
        cp_model.OPTIMAL: "optimal",
        cp_model.FEASIBLE: "feasible",
        cp_model.INFEASIBLE: "infeasible",
        cp_model.MODEL_INVALID: "error",
    }.get(status, "timeout")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        bound = int(solver.best_objective_bound) if status == cp_model.UNKNOWN else None
        return ModelResult(name, None, None, None, bound)
    yv = [int(solver.value(v)) for v in y]
    xv = {k: int(solver.value(v)) for k, v in x.items()}
    if model.tiebreak:  # no proven bound on the step time alone
        return ModelResult(name, yv, xv, sum(int(solver.value(v)) for v in t_mb), None)
    return ModelResult(name, yv, xv, int(round(solver.objective_value)), int(round(solver.best_objective_bound)))


CPSAT_IMPORT_MS = 400.0
"""Milliseconds loading OR-Tools' CP-SAT costs in a fresh process with numpy loaded: measured 184 to
216 ms on an idle 2-core machine, 357 to 661 ms on a busy one; this leaves room for a busy machine."""


class CpSatBackend:
    name = "cpsat"
    deterministic_limits = True
    """In deterministic mode every solve stops at a deterministic limit (DETERMINISTIC_TIME_SHARE), not the clock."""

    def available(self) -> bool:
        """Whether OR-Tools is installed, found without loading it (loading takes a few hundred ms)."""
        import importlib.util
        import sys

        if "ortools.sat.python.cp_model" in sys.modules:
            return True
        try:
            return importlib.util.find_spec("ortools.sat.python.cp_model") is not None
        except ImportError:
            return False

    def load_ms(self) -> float:
        import sys

        return 0.0 if "ortools.sat.python.cp_model" in sys.modules else CPSAT_IMPORT_MS

    def cold_load_ms(self) -> float:
        """What loading OR-Tools costs a process that has not loaded it (whatever this one has)."""
        return CPSAT_IMPORT_MS

    def solve(
        self,
        tables: CostTables,
        options: PlanOptions,
        hint: Assignment | None,
        deadline: float,
        on_improvement: ImprovementCallback | None = None,
    ) -> SolveResult:
        return improve(tables, options, hint, deadline, solve_model, on_improvement, clock=time.perf_counter)


register("cpsat", CpSatBackend)
