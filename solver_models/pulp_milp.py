"""The slot model of :mod:`solver_models.formulation` as a PuLP MILP, solved by HiGHS or CBC.

The numbered comments match the constraints of that module's docstring; times are integers of
``formulation.UNIT`` seconds, exactly as in the CP-SAT model. HiGHS runs in process (``highspy``)
and reports its MIP dual bound; CBC runs as a subprocess, takes the incumbent as a warm start and
gets a shorter time limit because its start-up and shut-down come on top. The status is read from
``sol_status`` (CBC says "Optimal" on a time-out while the solution status says integer-feasible),
so only a proven optimum is called ``optimal``. Neither solver reports improving solutions while it
runs here; the anytime trace of these backends holds the answers of the search rounds.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

from optimizer.costs import CostTables
from optimizer.options import PlanOptions
from optimizer.plan import Assignment
from solver_models.base import ImprovementCallback, SolveResult, register
from solver_models.formulation import SlotModel, model_ceiling
from solver_models.lns import ModelResult, improve

CBC_OVERHEAD_S = 0.06
"""Seconds CBC needs beyond its time limit (process start, model file, solution file)."""
CBC_MIN_LIMIT_S = 0.05
"""Shortest time limit CBC is started with (below it, it seldom gets past its root node)."""
HIGHS_LATENESS_S = 0.015
"""Seconds HiGHS may answer after its time limit (it checks the clock between phases)."""


def build_problem(model: SlotModel) -> tuple[Any, list[Any], dict[tuple[int, int], Any], list[Any]]:
    """The PuLP problem of ``model`` and its y, x and T variables."""
    import pulp

    prob = pulp.LpProblem("dhp_slots", pulp.LpMinimize)
    top = model_ceiling(model)
    var = prob.add_variable
    y = [var(f"y{s}", 0, 1, cat="Binary") for s in range(model.n_slots)]
    x: dict[tuple[int, int], Any] = {}
    for q, s, _ in model.arcs:
        c = model.item_count(q)
        x[(q, s)] = var(f"x{q}_{s}", 0, 1, cat="Binary") if c == 1 else var(f"x{q}_{s}", 0, c, cat="Integer")
    t_mb = [var(f"T{m}", model.floor[m], top) for m in range(model.n_mb)]
    u_mb = [var(f"U{m}", 0, top) for m in range(model.n_mb)] if model.tiebreak else []
    if model.tiebreak:
        prob += pulp.lpSum(t_mb) * model.tiebreak + pulp.lpSum(u_mb)
        for u, t in zip(u_mb, t_mb, strict=False):
            prob += u <= t
    else:
        prob += pulp.lpSum(t_mb)
    # 1. every sample in exactly one group
    for q, pairs in enumerate(model.pairs_by_item()):
        prob += pulp.lpSum(x[(q, s)] for s, _ in pairs) == model.item_count(q)
    load = []
    for s, pairs in enumerate(model.pairs_by_slot()):
        expr = model.b * y[s] + pulp.lpSum(t * x[(q, s)] for q, t in pairs)
        load.append(expr)
        # 2. slot time within its micro-batch (through U_m in a neighbourhood model)
        prob += expr <= (u_mb if model.tiebreak else t_mb)[model.slot_m[s]]
        # 3. memory per rank; x only on open slots
        prob += pulp.lpSum(model.item_tokens[q] * x[(q, s)] for q, _ in pairs) <= model.slot_cap[s] * y[s]
    # 4. node and micro-batch capacity
    for slots, ranks in model.capacity_rows():
        prob += pulp.lpSum(model.slot_d[s] * y[s] for s in slots) <= ranks
    # 5. symmetry: identical slots open in order with falling loads; interchangeable micro-batches by time
    for a, b in model.identical_pairs():
        prob += y[a] >= y[b]
        prob += load[a] >= load[b]
    if model.symmetric_mbs:
        for m in range(model.n_mb - 1):
            prob += t_mb[m] >= t_mb[m + 1]
    return prob, y, x, t_mb


@functools.cache
def _silence_highs_banner() -> None:
    """HiGHS prints a banner to stdout when the first instance of a process is made; make that one here, muted."""
    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _solve_with(solver_name: str, model: SlotModel, time_limit_s: float, options: PlanOptions) -> ModelResult:
    import pulp

    if solver_name == "highs":
        _silence_highs_banner()
    prob, y, x, t_mb = build_problem(model)
    if solver_name == "highs":
        solver = pulp.HiGHS(msg=False, timeLimit=max(0.001, time_limit_s), threads=options.solver_workers)
    else:
        limit = time_limit_s - CBC_OVERHEAD_S
        if limit < CBC_MIN_LIMIT_S:
            return ModelResult("timeout", None, None, None, None)
        warm = bool(model.hint_x)
        if warm:
            for s, v in enumerate(model.hint_y):
                y[s].setInitialValue(v)
            for key, var in x.items():
                var.setInitialValue(model.hint_x.get(key, 0))
        with warnings.catch_warnings():  # the bundled CBC binary is what a plain install has
            warnings.simplefilter("ignore", DeprecationWarning)
            solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=limit, threads=options.solver_workers, warmStart=warm, timeMode="elapsed")
    try:
        prob.solve(solver)
    except pulp.PulpSolverError as exc:  # CBC may exit without a solution file when stopped very early
        return ModelResult("error", None, None, None, None, message=str(exc))
    sol = prob.sol_status
    if sol == pulp.LpSolutionInfeasible:
        return ModelResult("infeasible", None, None, None, None)
    if sol not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        return ModelResult("timeout" if sol == pulp.LpSolutionNoSolutionFound else "error", None, None, None, _highs_bound(prob, solver_name))
    yv = [int(round(v.value() or 0)) for v in y]
    xv = {k: int(round(v.value() or 0)) for k, v in x.items()}
    objective = sum(int(round(v.value() or 0)) for v in t_mb)
    status = "optimal" if sol == pulp.LpSolutionOptimal else "feasible"
    bound = None
    if not model.tiebreak:
        bound = _highs_bound(prob, solver_name) if solver_name == "highs" else None
        if status == "optimal" and bound is None:
            bound = objective
    return ModelResult(status, yv, xv, objective, bound)


def _highs_bound(prob: Any, solver_name: str) -> int | None:
    """HiGHS's MIP dual bound, rounded up (the objective takes integer values)."""
    if solver_name != "highs":
        return None
    try:
        info = prob.solverModel.getInfo()
        bound = float(info.mip_dual_bound)
    except Exception:  # noqa: BLE001 - an unreadable bound is simply not reported
        return None
    if not bound > -1e30 or bound != bound:
        return None
    return max(0, math.ceil(bound - 1e-6))


def _model_solver(solver_name: str) -> Callable[[SlotModel, float, PlanOptions, Callable[[int, int | None], None] | None], ModelResult]:
    def solve_model(model: SlotModel, time_limit_s: float, options: PlanOptions, on_solution: Callable[[int, int | None], None] | None = None) -> ModelResult:
        res = _solve_with(solver_name, model, time_limit_s, options)
        if on_solution is not None and res.objective is not None:
            on_solution(res.objective, res.bound)
        return res

    return solve_model


class PulpBackend:
    def __init__(self, solver_name: str) -> None:
        self.name = solver_name

    def available(self) -> bool:
        try:
            import pulp
        except ImportError:
            return False
        try:
            if self.name == "highs":
                return bool(pulp.HiGHS(msg=False).available())
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                return bool(pulp.PULP_CBC_CMD(msg=False).available())
        except Exception:  # noqa: BLE001 - a broken installation counts as missing
            return False

    def solve(self, tables: CostTables, options: PlanOptions, hint: Assignment | None, deadline: float, on_improvement: ImprovementCallback | None = None) -> SolveResult:
        if self.name == "cbc":
            return improve(tables, options, hint, deadline, _model_solver(self.name), on_improvement, self.name,
                           round_s=0.3 + CBC_OVERHEAD_S, min_round_s=2 * CBC_OVERHEAD_S, lateness_s=0.02)
        return improve(tables, options, hint, deadline, _model_solver(self.name), on_improvement, self.name, lateness_s=HIGHS_LATENESS_S)


register("highs", lambda: PulpBackend("highs"))
register("cbc", lambda: PulpBackend("cbc"))
