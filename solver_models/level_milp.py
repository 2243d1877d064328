"""A small integer program held as arrays, and its solution by CP-SAT or HiGHS.

:class:`Milp` is what :mod:`solver_models.global_model` builds: integer columns with bounds and
costs, rows ``lo <= sum a x <= hi`` with integer coefficients, and an optional starting point. Both
solvers read the same arrays, so the two backends solve exactly the same model. Each call returns
the best solution found within its time limit (the start point counts as found when it is
feasible), or None.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

INF = float("inf")
CPSAT_LATENESS_S = 0.01
"""Seconds CP-SAT may answer after its time limit (presolve and shut-down of a model of this size)."""
HIGHS_LIMIT_SHARE = 0.8
"""Share of the time left that HiGHS is given (it checks the clock between phases and answers late)."""


@dataclass
class Milp:
    """min cost . x  s.t.  row_lo <= A x <= row_hi,  lb <= x <= ub,  x integer."""

    lb: list[int] = field(default_factory=list)
    ub: list[int] = field(default_factory=list)
    cost: list[int] = field(default_factory=list)
    rows: list[tuple[list[int], list[int], float, float]] = field(default_factory=list)
    start: list[int] | None = None

    def add_var(self, lb: int, ub: int, cost: int = 0) -> int:
        self.lb.append(int(lb))
        self.ub.append(int(ub))
        self.cost.append(int(cost))
        return len(self.lb) - 1

    def add_row(self, cols: list[int], vals: list[int], lo: float, hi: float) -> None:
        if cols:
            self.rows.append((list(cols), [int(v) for v in vals], lo, hi))

    @property
    def n_vars(self) -> int:
        return len(self.lb)

    def feasible(self, x: list[int]) -> bool:
        """True when ``x`` satisfies every bound and row."""
        if any(not lo <= v <= hi for v, lo, hi in zip(x, self.lb, self.ub, strict=True)):
            return False
        return all(lo <= sum(a * x[c] for c, a in zip(cols, vals, strict=True)) <= hi for cols, vals, lo, hi in self.rows)

    def objective(self, x: list[int]) -> int:
        return sum(c * v for c, v in zip(self.cost, x, strict=True))


@dataclass
class MilpResult:
    status: str  # optimal, feasible, timeout, infeasible, error
    x: list[int] | None
    objective: int | None


def solve_cpsat(milp: Milp, deadline: float, workers: int = 1, deterministic: bool = False) -> MilpResult:
    """``milp`` by CP-SAT, hinted with its start point, returning by ``deadline`` (a ``time.perf_counter()`` value)."""
    from ortools.sat.python import cp_model

    cp = cp_model.CpModel()
    xs = [cp.new_int_var(lo, hi, f"v{j}") for j, (lo, hi) in enumerate(zip(milp.lb, milp.ub, strict=True))]
    for cols, vals, lo, hi in milp.rows:
        expr = cp_model.LinearExpr.weighted_sum([xs[c] for c in cols], vals)
        if lo == hi:
            cp.add(expr == int(lo))
            continue
        if lo > -INF:
            cp.add(expr >= int(np.ceil(lo)))
        if hi < INF:
            cp.add(expr <= int(np.floor(hi)))
    cp.minimize(cp_model.LinearExpr.weighted_sum(xs, milp.cost))
    if milp.start is not None:
        for var, v in zip(xs, milp.start, strict=True):
            cp.add_hint(var, int(v))
    time_limit_s = deadline - time.perf_counter() - CPSAT_LATENESS_S
    if time_limit_s < 0.005:
        return MilpResult("timeout", None, None)
    solver = cp_model.CpSolver()
    params = solver.parameters
    params.max_time_in_seconds = time_limit_s
    params.num_workers = workers
    params.log_search_progress = False
    if hasattr(params, "catch_sigint_signal"):
        params.catch_sigint_signal = False
    if deterministic:
        params.max_deterministic_time = max(0.001, 0.1 * time_limit_s)
    status = solver.solve(cp)
    name = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible", cp_model.INFEASIBLE: "infeasible", cp_model.MODEL_INVALID: "error"}.get(status, "timeout")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return MilpResult(name, None, None)
    x = [int(solver.value(v)) for v in xs]
    return MilpResult(name, x, milp.objective(x))


def solve_highs(milp: Milp, deadline: float, workers: int = 1, deterministic: bool = False) -> MilpResult:
    """``milp`` by HiGHS (in process), started from its start point when that is feasible, returning
    by ``deadline`` (a ``time.perf_counter()`` value)."""
    import highspy

    from solver_models.pulp_milp import _silence_highs_banner, highs_threads

    _silence_highs_banner()
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", highs_threads(workers))  # one count per process (see highs_threads)
    h.setOptionValue("mip_rel_gap", 1e-6)
    h.setOptionValue("mip_pool_soft_limit", 50)
    h.setOptionValue("mip_heuristic_effort", 0.3)
    inf = highspy.kHighsInf
    n = milp.n_vars
    h.addCols(n, np.asarray(milp.cost, dtype=np.float64), np.asarray(milp.lb, dtype=np.float64), np.asarray(milp.ub, dtype=np.float64),
              0, np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(0))
    h.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.full(n, highspy.HighsVarType.kInteger))
    lo = np.array([r[2] if r[2] > -INF else -inf for r in milp.rows], dtype=np.float64)
    hi = np.array([r[3] if r[3] < INF else inf for r in milp.rows], dtype=np.float64)
    lengths = np.fromiter((len(r[0]) for r in milp.rows), dtype=np.int64, count=len(milp.rows))
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32)
    index = np.fromiter((c for r in milp.rows for c in r[0]), dtype=np.int32)
    value = np.fromiter((v for r in milp.rows for v in r[1]), dtype=np.float64)
    h.addRows(len(milp.rows), lo, hi, index.shape[0], starts, index, value)
    if milp.start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = [float(v) for v in milp.start]
        sol.value_valid = True
        h.setSolution(sol)
    time_limit_s = (deadline - time.perf_counter()) * HIGHS_LIMIT_SHARE
    if time_limit_s < 0.005:
        return MilpResult("timeout", None, None)
    h.setOptionValue("time_limit", time_limit_s)
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return MilpResult("infeasible", None, None)
    info = h.getInfo()
    if info.primal_solution_status != highspy.SolutionStatus.kSolutionStatusFeasible:
        return MilpResult("timeout", None, None)
    x = [int(round(v)) for v in h.getSolution().col_value]
    if not milp.feasible(x):  # HiGHS's tolerances: keep only what holds exactly
        return MilpResult("error", None, None)
    return MilpResult("optimal" if status == highspy.HighsModelStatus.kOptimal else "feasible", x, milp.objective(x))


SOLVERS = {"cpsat": solve_cpsat, "highs": solve_highs}
"""The solvers the global model runs on, by backend name."""
