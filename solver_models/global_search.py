"""One global step before the neighbourhood search: the bucket model of :mod:`solver_models.global_model`.

It runs only where it can pay: the starting plan is more than ``GAP`` times the lower bound of
:func:`optimizer.bounds.lower_bound`, at least ``MIN_SECONDS`` are left, the backend has a solver
for it (CP-SAT, HiGHS) and the options do not ask for reproducible answers (its time limit would
make the answer depend on the clock). It gets ``SHARE`` of the time left; its decoded plan is
checked by :func:`optimizer.verify.check_assignment` and kept only when it is faster than the start.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from optimizer.bounds import lower_bound
from optimizer.costs import CostTables
from optimizer.evaluate import assignment_step_time
from optimizer.options import PlanOptions
from optimizer.plan import Assignment
from optimizer.verify import check_assignment
from solver_models.global_model import UNIT, build, decode
from solver_models.level_milp import SOLVERS

GAP = 1.03
"""The global model runs when the starting plan is slower than this times the lower bound."""
SHARE = 0.5
"""Share of the time left that the global model may take (the neighbourhood search gets the rest)."""
MIN_SECONDS = 0.08
"""Least seconds left for which the global model is started."""


def global_step(tables: CostTables, options: PlanOptions, hint: Assignment, h_time: float, deadline: float, name: str,
                clock: Callable[[], float] = time.perf_counter) -> tuple[Assignment | None, float, dict[str, Any]]:
    """(a plan faster than ``hint`` or None, its step time or ``h_time``, what happened)."""
    start = clock()
    solver = SOLVERS.get(name)
    if solver is None or options.deterministic:
        return None, h_time, {}
    left = deadline - start
    if left < MIN_SECONDS:
        return None, h_time, {"skipped": f"{left * 1000.0:.0f} ms left"}
    bound = lower_bound(tables)
    if h_time <= GAP * bound:
        return None, h_time, {"skipped": f"start within {GAP:.2f}x the lower bound"}
    model = build(tables, hint)
    built = clock()
    details: dict[str, Any] = {"build_ms": round((built - start) * 1000.0, 3), **model.size(), **model.info}
    res = solver(model.milp, start + SHARE * left, options.solver_workers, False)
    solved = clock()
    details.update(status=res.status, solve_ms=round((solved - built) * 1000.0, 3))
    if res.x is None:
        return None, h_time, details
    details["model_objective_s"] = round(res.objective * UNIT, 6) if res.objective is not None else None
    assignment = decode(model, res.x)
    if assignment is None:
        details["decoded"] = "no plan"
        return None, h_time, details
    check = check_assignment(tables.problem, assignment)
    if not check.ok:
        details["decoded"] = "invalid: " + check.violations[0]
        return None, h_time, details
    objective = assignment_step_time(tables, assignment)
    details.update(decoded_s=round(objective, 6), decode_ms=round((clock() - solved) * 1000.0, 3))
    if objective < h_time * (1 - 1e-9):
        return assignment, objective, details
    return None, h_time, details
