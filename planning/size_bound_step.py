"""The group-size LP bound (:mod:`solver_models.size_bound`) within the plan's budget.

It runs after the heuristic, when the best plan so far is more than SIZE_BOUND_GAP above the bound in
hand (closer, the LP rarely moves the gap a user sees), until the instant the budget policy gives it
(:meth:`planning.budget_policy.PhaseBudget.size_bound_due`: a share of the time the solver would
otherwise get, or all the time left when no solver follows); loading HiGHS counts when it is not loaded
yet. Deterministic plans get no instant and skip it: their answer may not depend on the clock, and an
LP stopped by its time limit would.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from optimizer.costs.tables import CostTables

SIZE_BOUND_GAP = 0.01
"""Least relative gap between the plan in hand and the bound for which the LP runs."""
HIGHS_LOAD_MS = 30.0
"""What loading HiGHS may cost (10 to 14 ms measured on the idle 2-core development machine)."""
COLUMNS_PER_MS = 200.0
"""LP columns (sample and size pairs) one millisecond builds and solves, conservatively, after a fixed
LP_SETUP_MS: measured on the 2-core development machine (a second process running) 147 to 264 per ms
on the slowest batches of the plan-quality grid (512 samples; several micro-batch counts solved),
754 in the median. An LP larger than the time allows is not started: building it cannot be stopped,
and HiGHS overshoots its time limit by up to 18 ms."""
LP_SETUP_MS = 1.0


def size_bound_within(
    tables: CostTables, upper_s: float, bound_s: float, due: float | None, clock: Callable[[], float]
) -> float | None:
    """The LP bound by ``due`` (a ``clock()`` instant), or None when skipped (see the module docstring:
    no instant, a small gap, too little time), out of time or not installed."""
    if due is None or not upper_s > bound_s * (1 + SIZE_BOUND_GAP):
        return None
    allowed_ms = (due - clock()) * 1000.0
    if "highspy" not in sys.modules:
        allowed_ms -= HIGHS_LOAD_MS
    from solver_models.size_bound import column_count, size_bound

    if LP_SETUP_MS + column_count(tables) / COLUMNS_PER_MS > allowed_ms:
        return None
    return size_bound(tables, upper_s, clock() + allowed_ms / 1000.0, clock)
