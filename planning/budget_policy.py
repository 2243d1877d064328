"""One plan's time budget: the request's deadline and the problem's size turned into every phase's instant.

One :class:`planning.deadline.Deadline` covers the call. :func:`phase_budget` reads it once, after the
cost tables are built, with the batch's size and the fixed work's rates measured on this machine
(:mod:`planning.fixed_work`), and fixes the phases' instants (``clock()`` values, in seconds):

- *reserve*: the time kept back at the end for building and verifying the plan (:func:`reserve_ms`:
  before the heuristic from the batch's size; after it from what one evaluation of its plan took);
- *bound*: the tighter lower bounds run before the heuristic only when they can start by
  ``tight_bounds_by``, else after it when :meth:`PhaseBudget.room_for` finds room;
- *heuristic*: its strategies after its first plan stop at ``heuristic_due`` (HEURISTIC_SHARE of the
  budget when an exact backend may follow, HEURISTIC_ALONE_SHARE when not, never into the reserve);
- *solver*: the one deadline an exact backend is handed, the request's deadline less the reserve
  (:meth:`PhaseBudget.solver_window`, from the evaluation's time; ``rescue`` before the heuristic
  has a plan), and the group-size LP's share of the time up to it (:meth:`PhaseBudget.size_bound_due`);
- *hard stop*: when the wait for a backend's answer ends (:mod:`planning.solve_watch`), GRACE_MS after
  the solver's deadline, or DETERMINISTIC_WAIT_BUDGETS budgets after it with ``options.deterministic``.

With ``options.deterministic`` the answer may not depend on the clock: the heuristic has no instant
(it runs all its strategies), every optional phase has room and the group-size LP does not run.

The planning layer's timing constants are defined here. A lower layer's are the algorithm's own
(:mod:`solver_models.lns` for the neighbourhood rounds, :mod:`solver_models.cpsat` and
:mod:`solver_models.pulp_milp` for their solvers' overheads): a backend gets its deadline as an argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optimizer.costs.tables import CostTables
from planning.deadline import Deadline
from planning.fixed_work import phase_ms
from solver_models import whole_model_fits

ESTIMATE_SAFETY = 2.0
"""The time kept back for building and verifying, and the room an optional phase needs to start, are this
many times their estimates: the rates are those of the fastest calibration run (:mod:`planning.fixed_work`),
and the fixed work measured 0.8 to 1.5 times the estimate over video, long-text, image-SFT and mixed
batches of 2,048 to 65,536 samples on the shared 2-core development machine (``python -m bench.scaling
--budget-ms`` reports both)."""
HEURISTIC_SHARE = 0.75
"""Share of the budget the heuristic may use when an exact backend follows: on long-tail batches its
strategies gained more than the neighbourhood search did in the same time (``python -m bench.solver_bench``
compares the planners at equal budgets)."""
HEURISTIC_ALONE_SHARE = 0.9
"""Share of the budget the heuristic may use when no exact backend follows (the reserve caps it too; the
rest is room for the static layout's comparison and the tighter bounds). Chosen, not measured."""
HEURISTIC_MS_PER_SAMPLE = 0.01
"""Expected heuristic milliseconds per sample, for deciding whether a solver may follow: measured 0.0015 to
0.003 from 512 to 65,536 samples (``python -m bench.scaling``); a budget below heuristic + reserve +
MIN_SOLVER_MS gives the heuristic HEURISTIC_ALONE_SHARE."""
MIN_SOLVER_MS = 20.0
"""Below this many milliseconds left for it, no exact backend is started (nor chosen by ``auto``).
Chosen, not measured."""
MIN_SEARCH_MS = 60.0
"""Least solver milliseconds for which ``auto`` starts a neighbourhood search on a problem too large for
one whole model: four rounds of :data:`solver_models.lns.ROUND_S`, a few rounds for a search to pay off."""
RESERVE_MS = 3.0
RESERVE_EVALS = 8.0
"""Milliseconds kept back from the solver for checking its answer, building and verifying the plan:
RESERVE_MS plus RESERVE_EVALS times what one evaluation of the heuristic's plan took (the work after
the solver is about five such passes: measured 0.6 ms of building and verifying after a 0.15 ms
evaluation at 512 samples, 105 ms after 15 ms at 65,536, on the 2-core development machine; eight
leave room for a busy machine), plus GRACE_MS, so that a solve stopped at its deadline still leaves
this work its time before the caller's deadline. The work after the heuristic or the solver is also
estimated from the rates measured here, ESTIMATE_SAFETY times over, and the larger figure kept."""
GRACE_MS = 5.0
"""How long after its deadline a backend's answer is still awaited: the backends aim to answer by the
deadline itself, and this covers the last round's usual lateness (``python -m bench.budget_run`` checks
every answer against its budget + 20 ms, over random problems, backends and budgets of 10 ms to 3 s)."""
DETERMINISTIC_WAIT_BUDGETS = 4.0
"""Deterministic mode: the wait for a backend ends this many budgets (``options.time_budget_ms``) after
its deadline, a safety net only. It lies above the longest CP-SAT's own wall-clock caps allow a
deterministic solve: 3.3 budgets for the neighbourhood rounds
(:data:`solver_models.cpsat.DETERMINISTIC_WALL_LIMITS` over :data:`solver_models.lns.DETERMINISTIC_ROUND_SHARE`),
2.5 for the whole model (the wall limits times :data:`solver_models.lns.DETERMINISTIC_WHOLE_SHARE`)."""
SIZE_BOUND_SHARE = 0.2
"""Most share of the time up to the solver's deadline the group-size LP may take when a solver follows
(all of it when none does). Chosen, not measured."""


def reserve_ms(tables: CostTables, eval_ms: float | None = None) -> float:
    """Milliseconds kept back after the heuristic or the solver returns: before the heuristic, building,
    verifying and the static layout's comparison estimated from the batch's size; after it, from one
    evaluation's time ``eval_ms`` (see RESERVE_EVALS)."""
    n = tables.n_samples
    if eval_ms is None:
        return GRACE_MS + RESERVE_MS + ESTIMATE_SAFETY * (phase_ms("finish", n) + phase_ms("static", n))
    return GRACE_MS + RESERVE_MS + max(RESERVE_EVALS * eval_ms, ESTIMATE_SAFETY * phase_ms("finish", n))


def finish_reserve_ms(tables: CostTables) -> float:
    """Milliseconds kept back, after the optional phases, for building and verifying the plan."""
    return GRACE_MS + RESERVE_MS + ESTIMATE_SAFETY * phase_ms("finish", tables.n_samples)


def solver_may_follow(tables: CostTables, backend: str, budget_ms: float) -> bool:
    """Whether a budget of ``budget_ms`` leaves an exact backend time after the heuristic (then the
    heuristic gets HEURISTIC_SHARE of it, else HEURISTIC_ALONE_SHARE)."""
    expected_ms = HEURISTIC_MS_PER_SAMPLE * tables.n_samples + reserve_ms(tables) + MIN_SOLVER_MS
    if backend == "heuristic" or budget_ms < expected_ms:
        return False
    if backend != "auto":
        return True
    # auto starts no neighbourhood search with under MIN_SEARCH_MS left: then the heuristic may use that time.
    after_ms = budget_ms * (1 - HEURISTIC_SHARE) - reserve_ms(tables)
    return after_ms >= MIN_SEARCH_MS or whole_model_fits(tables)


@dataclass(frozen=True)
class SolveWindow:
    """An exact solve's time: ``due``, the one deadline its backend is handed; ``hard_stop``, when the
    wait for its answer ends; ``reserve_ms``, what is kept back after ``due`` for the plan's last steps."""

    due: float
    hard_stop: float
    reserve_ms: float


@dataclass(frozen=True)
class PhaseBudget:
    """Every phase's instant of one plan (see the module docstring); made by :func:`phase_budget`."""

    deadline: Deadline
    deterministic: bool
    n_samples: int
    heuristic_due: float | None
    """The heuristic's strategies after its first plan stop here (None: deterministic, all of them run)."""
    tight_bounds_by: float
    """The tighter bounds run before the heuristic when they start by this instant."""
    finish_by: float
    """The optional phases after the heuristic start only when they end by this instant, estimated."""
    rescue: SolveWindow
    """The whole exact model's time when the heuristic finds no packing."""
    hard_stop_after_s: float
    """Seconds from a solver's deadline to its hard stop."""

    def room_for(self, phase: str) -> str | None:
        """Why the optional ``phase`` (``static`` or ``tight_bound``, :func:`planning.fixed_work.phase_ms`)
        does not start now, or None when it does."""
        if self.deterministic:
            return None
        estimate_ms = phase_ms(phase, self.n_samples)
        left_ms = (self.finish_by - self.deadline.clock()) * 1000.0
        if left_ms >= ESTIMATE_SAFETY * estimate_ms:
            return None
        return (
            f"the deadline leaves {max(left_ms, 0.0):.0f} ms after the time kept for building and verifying the plan; "
            f"it needs about {estimate_ms:.0f} ms here"
        )

    def tight_bounds_first(self) -> bool:
        """Whether the tighter bounds run now, before the heuristic."""
        return self.deterministic or self.deadline.clock() <= self.tight_bounds_by

    def solver_window(self, tables: CostTables, eval_ms: float) -> SolveWindow:
        """The exact backend's window once the heuristic's plan took ``eval_ms`` to evaluate."""
        reserve = reserve_ms(tables, eval_ms)
        due = self.deadline.due - reserve / 1000.0
        return SolveWindow(due, due + self.hard_stop_after_s, reserve)

    def size_bound_due(self, window: SolveWindow, solver_follows: bool) -> float | None:
        """When the group-size LP must end, starting now: SIZE_BOUND_SHARE of the time up to the solver's
        deadline when a solver follows, all of it when none does; None in deterministic mode."""
        if self.deterministic:
            return None
        now = self.deadline.clock()
        return now + (SIZE_BOUND_SHARE if solver_follows else 1.0) * (window.due - now)

    @property
    def reuse_due(self) -> float | None:
        """When moving the plan onto the job's existing groups must end (None: deterministic, no clock)."""
        return None if self.deterministic else self.deadline.due


def phase_budget(deadline: Deadline, tables: CostTables) -> PhaseBudget:
    """The instants of every phase of planning ``tables``' problem within ``deadline``."""
    options = tables.problem.options
    n = tables.n_samples
    deterministic = options.deterministic
    before = reserve_ms(tables)
    reserve_due = deadline.due - before / 1000.0
    heuristic_due = None
    if not deterministic:
        follows = solver_may_follow(tables, options.backend, deadline.budget_ms)
        heuristic_due = min(deadline.at(HEURISTIC_SHARE if follows else HEURISTIC_ALONE_SHARE), reserve_due)
    tight_ms = before + phase_ms("plan", n) + ESTIMATE_SAFETY * phase_ms("tight_bound", n)
    after_s = DETERMINISTIC_WAIT_BUDGETS * options.time_budget_ms / 1000.0 if deterministic else GRACE_MS / 1000.0
    return PhaseBudget(
        deadline=deadline,
        deterministic=deterministic,
        n_samples=n,
        heuristic_due=heuristic_due,
        tight_bounds_by=math.inf if deterministic else deadline.due - tight_ms / 1000.0,
        finish_by=deadline.due - finish_reserve_ms(tables) / 1000.0,
        rescue=SolveWindow(reserve_due, reserve_due + after_s, before),
        hard_stop_after_s=after_s,
    )
