"""The group-size LP bound (:mod:`solver_models.size_bound`) within the plan's budget.

It runs after the heuristic, when the best plan so far is more than SIZE_BOUND_GAP above the bound in
hand (closer, the LP rarely moves the gap a user sees), and only where it is wanted
(:func:`size_bound_skipped`): before an exact backend, whose search the raised bound helps end, or
when the caller asks for it (``options.tight_bound``). The heuristic alone answers in milliseconds
(some 4 ms at 64 ranks x 512 samples) and the LP takes tens of them (49 to 57 ms there, on the 2-core
development machine), so a heuristic-only plan does not pay for it unasked. It runs until the instant
the budget policy gives it (:meth:`planning.budget_policy.PhaseBudget.size_bound_due`: a share of the
time the solver would otherwise get when it runs unasked, all the time up to the solver's deadline when
asked); loading HiGHS counts when it is not loaded yet. Deterministic plans get no instant and skip it:
their answer may not depend on the clock, and an LP stopped by its time limit would.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from optimizer.costs.tables import CostTables
from optimizer.problem.options import PlanOptions

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
KINDS_COLUMNS_PER_MS = 35.0
"""The same on clusters of several GPU kinds, whose LP has a rank row and a waiting row per kind over
the columns of every kind: 40 to 452 per ms, 127 in the median, on the 20 ``stress-mixed-gpu`` batches
of the plan-quality grid (seeds 0 and 1, 512 samples, on the 2-core development machine, nothing else
running); set below the least of them."""
LP_SETUP_MS = 1.0
NOT_ASKED = (
    "not computed: no exact backend follows and options.tight_bound is not set (the heuristic's plan takes "
    "milliseconds, the LP tens of them)"
)
DETERMINISTIC = "not computed: options.deterministic (an LP stopped by its time limit would read the clock)"


def size_bound_skipped(options: PlanOptions, backend: str, upper_s: float, bound_s: float) -> str | None:
    """Why the LP does not run for this plan whatever the time (for ``solver.details["skipped"]``), or None
    when it may. Named only when the plan ``upper_s`` is far enough above ``bound_s`` for the LP to be
    worth asking for; ``backend`` is the exact backend that follows (``heuristic``: none)."""
    if not upper_s > bound_s * (1 + SIZE_BOUND_GAP):
        return None
    if options.deterministic:
        return DETERMINISTIC if options.tight_bound else None
    if backend == "heuristic" and not options.tight_bound:
        return NOT_ASKED
    return None


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
    from solver_models.size_bound import column_count, gpu_kinds, size_bound

    kinds = len(gpu_kinds(tables.for_bounds))
    rate = COLUMNS_PER_MS if kinds == 1 else KINDS_COLUMNS_PER_MS
    if LP_SETUP_MS + column_count(tables, kinds) / rate > allowed_ms:
        return None
    return size_bound(tables, upper_s, clock() + allowed_ms / 1000.0, clock)
