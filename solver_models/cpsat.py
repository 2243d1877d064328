"""CP-SAT (OR-Tools) on the slot model of :mod:`solver_models.formulation`.

The numbered comments match the constraints of that module's docstring. Times are integers of
``formulation.UNIT`` seconds; the incumbent is given as a full hint; the time limit is what the
caller's deadline leaves after the build; ``solver_workers`` caps the threads; with
``deterministic`` the search is interleaved under a deterministic time limit (still capped by wall
time). A solution callback reports each improving solution. The bound is CP-SAT's
``best_objective_bound``, not the status: only a closed gap is a proof.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from optimizer.costs import CostTables
from optimizer.options import PlanOptions
from optimizer.plan import Assignment
from solver_models.base import ImprovementCallback, SolveResult, register
from solver_models.formulation import SlotModel, model_ceiling
from solver_models.lns import ModelResult, improve

DETERMINISTIC_SHARE = 0.1
"""Deterministic time limit as a share of the wall-clock limit (deterministic mode)."""


def solve_model(model: SlotModel, time_limit_s: float, options: PlanOptions, on_solution: Callable[[int, int | None], None] | None = None) -> ModelResult:
    """Solve one slot model with CP-SAT within ``time_limit_s`` seconds."""
    from ortools.sat.python import cp_model

    cp = cp_model.CpModel()
    y = [cp.new_bool_var(f"y{s}") for s in range(model.n_slots)]
    x: dict[tuple[int, int], cp_model.IntVar] = {}
    for q, s, _ in model.arcs:
        c = model.item_count(q)
        x[(q, s)] = cp.new_bool_var(f"x{q}_{s}") if c == 1 else cp.new_int_var(0, c, f"x{q}_{s}")
    top = model_ceiling(model)
    t_mb = [cp.new_int_var(model.floor[m], top, f"T{m}") for m in range(model.n_mb)]
    u_mb = [cp.new_int_var(0, top, f"U{m}") for m in range(model.n_mb)] if model.tiebreak else []
    for u_var, t_var in zip(u_mb, t_mb, strict=False):  # u_mb is empty without a tie-break
        cp.add(u_var <= t_var)
    # 1. every sample in exactly one group
    for q, pairs in enumerate(model.pairs_by_item()):
        cp.add(sum(x[(q, s)] for s, _ in pairs) == model.item_count(q))
    load = []
    for s, pairs in enumerate(model.pairs_by_slot()):
        expr = model.b * y[s] + sum(t * x[(q, s)] for q, t in pairs)
        load.append(expr)
        # 2. slot time within its micro-batch (through U_m in a neighbourhood model)
        cp.add(expr <= (u_mb if model.tiebreak else t_mb)[model.slot_m[s]])
        # 3. memory per rank; x only on open slots
        cp.add(sum(model.item_tokens[q] * x[(q, s)] for q, _ in pairs) <= model.slot_cap[s] * y[s])
    # 4. node and micro-batch capacity
    for slots, ranks in model.capacity_rows():
        cp.add(sum(model.slot_d[s] * y[s] for s in slots) <= ranks)
    # 5. symmetry: identical slots open in order with falling loads; interchangeable micro-batches by time
    for a, b in model.identical_pairs():
        cp.add(y[a] >= y[b])
        cp.add(load[a] >= load[b])
    if model.symmetric_mbs:
        for m in range(model.n_mb - 1):
            cp.add(t_mb[m] >= t_mb[m + 1])
    if model.tiebreak:
        cp.minimize(model.tiebreak * sum(t_mb) + sum(u_mb))
    else:
        cp.minimize(sum(t_mb))
    if model.hint_x:
        for s, v in enumerate(model.hint_y):
            cp.add_hint(y[s], v)
        for key, var in x.items():
            cp.add_hint(var, model.hint_x.get(key, 0))
        for m, v in enumerate(model.hint_t):
            cp.add_hint(t_mb[m], max(v, model.floor[m]))
            if model.tiebreak:
                cp.add_hint(u_mb[m], v)

    solver = cp_model.CpSolver()
    params = solver.parameters
    params.max_time_in_seconds = max(0.001, time_limit_s)
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
        # A tenth of the wall limit in deterministic units: the deterministic limit, not the clock, ends a search
        # unless the machine is ten times slower than CP-SAT's estimate (a loaded machine).
        params.max_deterministic_time = max(0.001, DETERMINISTIC_SHARE * time_limit_s)

    class _Callback(cp_model.CpSolverSolutionCallback):
        def __init__(self) -> None:
            super().__init__()

        def on_solution_callback(self) -> None:
            if on_solution is not None:
                on_solution(int(round(self.objective_value)), int(round(self.best_objective_bound)))

    status = solver.solve(cp, _Callback())
    name = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible", cp_model.MODEL_INVALID: "error"}.get(status, "timeout")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        bound = int(solver.best_objective_bound) if status == cp_model.UNKNOWN else None
        return ModelResult(name, None, None, None, bound)
    yv = [int(solver.value(v)) for v in y]
    xv = {k: int(solver.value(v)) for k, v in x.items()}
    if model.tiebreak:  # no proven bound on the step time alone
        return ModelResult(name, yv, xv, sum(int(solver.value(v)) for v in t_mb), None)
    return ModelResult(name, yv, xv, int(round(solver.objective_value)), int(round(solver.best_objective_bound)))


class CpSatBackend:
    name = "cpsat"

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

    def solve(self, tables: CostTables, options: PlanOptions, hint: Assignment | None, deadline: float, on_improvement: ImprovementCallback | None = None) -> SolveResult:
        return improve(tables, options, hint, deadline, solve_model, on_improvement, clock=time.perf_counter)


register("cpsat", CpSatBackend)
