"""One plan's time budget: the request's deadline and the problem's size turned into every phase's instant.

The budget itself is the caller's number of milliseconds, or, for ``options.time_budget_ms: "auto"`` (a plan
asked for one step ahead), AUTO_SHARE of the previous step's measured time up to AUTO_CAP_MS
(:func:`resolve_budget`, once, before the deadline is made; the plan's ``solver.details.budget`` says how).

One :class:`planning.deadline.Deadline` covers the call. :func:`phase_budget` reads it once, after the
cost tables are built, with the batch's size and the fixed work's rates measured on this machine
(:mod:`planning.fixed_work`), and fixes the phases' instants (``clock()`` values, in seconds):

- *reserve*: the time kept back at the end for building and verifying the plan (:func:`reserve_ms`:
  before the heuristic from the batch's size; after it from what one evaluation of its plan took);
- *bound*: the tighter lower bounds run before the heuristic only when they can start by
  ``tight_bounds_by``, else after it when :meth:`PhaseBudget.room_for` finds room;
- *heuristic*: its strategies after its first plan stop at ``heuristic_due`` (HEURISTIC_SHARE of the
  budget, never into the reserve), whether or not an exact backend follows: a backend starts from the plan
  the heuristic alone would have returned, with the time its strategies leave, so that it never returns a
  slower plan than the heuristic alone at the same budget;
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
from dataclasses import dataclass, replace

from optimizer.costs.tables import CostTables
from optimizer.problem.options import AUTO_BUDGET, OPTIONS
from optimizer.problem.problem import Problem
from planning.deadline import Deadline
from planning.fixed_work import phase_ms, problem_budget_ms

AUTO_SHARE = 0.5
"""``time_budget_ms: "auto"``: the share of the previous step's measured time the plan of the next batch may
take. That plan is asked for when a step starts and is due when the next one starts; the other half is left
for the way to the service and back, a queue ahead of the request, and the training step's own use of the
host the planner may share. Chosen, not measured."""
AUTO_CAP_MS = 2000.0
"""``"auto"`` asks for at most this many milliseconds, however long the step (an evaluation or a checkpoint
makes one step look long): a few seconds let CP-SAT's neighbourhood search run a hundred rounds or more
(:data:`solver_models.lns.ROUND_S`), and a plan longer than that keeps a solve worker from the next
requests. Chosen, not measured."""

ESTIMATE_SAFETY = 2.0
"""The time kept back for building and verifying, and the room an optional phase needs to start, are this
many times their estimates: the rates are those of the fastest calibration run (:mod:`planning.fixed_work`),
and the fixed work measured 0.8 to 1.5 times the estimate over video, long-text, image-SFT and mixed
batches of 2,048 to 65,536 samples on the shared 2-core development machine (``python -m bench.scaling
--budget-ms`` reports both)."""
PYTHON_KERNELS_MAX_BUDGET_MS = 1000.0
"""The longest budget a process that has not loaded the compiled kernels plans with their Python forms
(:mod:`planning.kernel_choice`): past it the heuristic's search and the bounds get more done compiled,
and loading them (about half a second on the development machine) is a smaller share of the budget."""
HEURISTIC_SHARE = 0.9
"""Share of the budget the heuristic's strategies may use, whether or not an exact backend follows (the
reserve caps it too). An exact backend gets what the strategies leave, and so starts from the plan the
heuristic alone would have returned: with 0.75 when a backend might follow, a backend's plan was slower
than the heuristic alone's at the same budget on up to 5 of 10 batches of 512 samples, by up to 6.8%,
against at most 1.9% with 0.9, within the heuristic's own run-to-run spread (``python -m bench.budget_pays``
run on both rules under the analytical profile, the FlexSP 7B fit and two stress profiles). The rest is
room for the static layout's comparison and the tighter bounds. Chosen, then measured."""
CUT_SHARE = 0.5
"""A heuristic that ended past this share of the way to its instant is taken to have been cut short by it
(a strategy stops before a piece its last one says will not fit; a larger budget lengthens it too): the
budget a "no solver ran" reason asks for errs on the large side. Chosen, not measured."""
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


def _ms(value: float) -> str:
    """Milliseconds as a message shows them: whole from 10, to a tenth from 1, else to a hundredth (a phase of
    0.03 ms is not 0)."""
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}" if value >= 1 else f"{value:.2f}"


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
        kept_ms = (self.deadline.due - self.finish_by) * 1000.0
        if left_ms <= 0:
            return (
                f"planning was {_ms(-left_ms)} ms into the {_ms(kept_ms)} ms kept for building and verifying the "
                f"plan (of a {_ms(self.deadline.budget_ms)} ms budget); it needs about "
                f"{_ms(ESTIMATE_SAFETY * estimate_ms)} ms before them"
            )
        return (
            f"the deadline leaves {_ms(left_ms)} ms after the {_ms(kept_ms)} ms kept for building and verifying the "
            f"plan; it needs about {_ms(ESTIMATE_SAFETY * estimate_ms)} ms here"
        )

    def heuristic_cut_short(self, ended_ms: float) -> bool:
        """Whether a heuristic that ended ``ended_ms`` after the deadline's start may have been stopped by its
        instant rather than have run out of strategies (past CUT_SHARE of the way to it)."""
        if self.heuristic_due is None:
            return False
        return ended_ms >= CUT_SHARE * (self.heuristic_due - self.deadline.start) * 1000.0

    def tight_bounds_first(self) -> bool:
        """Whether the tighter bounds run now, before the heuristic."""
        return self.deterministic or self.deadline.clock() <= self.tight_bounds_by

    def solver_window(self, tables: CostTables, eval_ms: float) -> SolveWindow:
        """The exact backend's window once the heuristic's plan took ``eval_ms`` to evaluate; in deterministic
        mode a whole budget from now, however long the heuristic took (the backend runs a fixed amount of work,
        and the window only bounds the wait for it)."""
        reserve = reserve_ms(tables, eval_ms)
        if self.deterministic:
            due = self.deadline.clock() + self.deadline.budget_ms / 1000.0
        else:
            due = self.deadline.due - reserve / 1000.0
        return SolveWindow(due, due + self.hard_stop_after_s, reserve)

    def solver_ms(self, window: SolveWindow) -> float:
        """Milliseconds an exact backend has to solve in: what the deadline leaves before ``window``'s reserve;
        in deterministic mode the whole budget, whatever the clock says (so whether a backend starts depends
        on the input alone)."""
        if self.deterministic:
            return self.deadline.budget_ms
        return self.deadline.left_ms() - window.reserve_ms

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
        heuristic_due = min(deadline.at(HEURISTIC_SHARE), reserve_due)
    tight_ms = before + phase_ms("plan", n) + ESTIMATE_SAFETY * phase_ms("tight_bound", n)
    after_s = DETERMINISTIC_WAIT_BUDGETS * options.budget_ms / 1000.0 if deterministic else GRACE_MS / 1000.0
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


def solver_budget_ms(
    solver_ms: float, kept_ms: float, after_ms: float, elapsed_ms: float, heuristic_cut: bool
) -> float:
    """About the least budget under which an exact backend gets ``solver_ms`` after the heuristic, from a plan
    that had used ``elapsed_ms`` when the solver was due to start, ``after_ms`` of them after the heuristic, and
    kept ``kept_ms`` back for building and verifying (all three ESTIMATE_SAFETY times over). When the
    heuristic's strategies ran up to their instant (``heuristic_cut``) they would take HEURISTIC_SHARE of a
    larger budget too, and the solver gets what they leave; else the heuristic ends as late as it did. Rounded
    up to 10 ms."""
    after = solver_ms + ESTIMATE_SAFETY * (kept_ms + after_ms)
    if heuristic_cut:
        needed = max(after / (1 - HEURISTIC_SHARE), ESTIMATE_SAFETY * elapsed_ms + after)
    else:
        needed = max(ESTIMATE_SAFETY * elapsed_ms + after, ESTIMATE_SAFETY * elapsed_ms / HEURISTIC_SHARE)
    return 10.0 * math.ceil(needed / 10.0)


def auto_budget(previous_step_s: float | None, cap_ms: float = AUTO_CAP_MS, least_ms: float = 0.0) -> tuple[float, str]:
    """The milliseconds ``time_budget_ms: "auto"`` stands for, and how they were worked out: AUTO_SHARE of
    the previous step's ``previous_step_s`` seconds, at most ``cap_ms``, then at least ``least_ms`` (and the
    option's least); without a previous step time, the option's default (at most ``cap_ms``). Whole
    milliseconds, so that the same step time gives the same request."""
    spec = OPTIONS["time_budget_ms"]
    lowest = spec.range.low if spec.range is not None and spec.range.low is not None else 1.0
    if previous_step_s is None:
        ms = float(min(spec.default, cap_ms))
        return ms, f'"auto" without options.previous_step_s: the default {ms:g} ms'
    share_ms = AUTO_SHARE * previous_step_s * 1000.0
    ms = float(round(min(share_ms, cap_ms)))
    reason = f'"auto": {AUTO_SHARE:g} x the previous step\'s {previous_step_s:g} s = {share_ms:.0f} ms'
    if share_ms > cap_ms:
        reason += f", capped at {cap_ms:g} ms"
    if ms < least_ms:
        ms = float(math.ceil(least_ms))
        reason += f", raised to the {ms:g} ms this batch needs here"
    if ms < lowest:
        ms = lowest
        reason += f", raised to the least budget, {ms:g} ms"
    return ms, reason


def resolve_budget(problem: Problem, cap_ms: float = AUTO_CAP_MS) -> Problem:
    """``problem`` with its budget in milliseconds: a number as given; ``"auto"`` worked out by
    :func:`auto_budget` from ``options.previous_step_s``, with how in ``problem.budget_reason``.

    Outside deterministic mode ``"auto"`` is at least the budget the batch's fixed work needs on this machine
    (:func:`planning.fixed_work.problem_budget_ms`): a step shorter than that would otherwise get its plan
    refused, where a plan a little late costs the trainer less. Deterministic plans are never refused, and
    their budget may not depend on this machine's rates. The service passes its ``DHP_MAX_BUDGET_MS`` as
    ``cap_ms`` when that is lower than AUTO_CAP_MS."""
    options = problem.options
    if options.time_budget_ms != AUTO_BUDGET:
        return problem
    least = 0.0 if options.deterministic else problem_budget_ms(problem)
    ms, reason = auto_budget(options.previous_step_s, cap_ms, least)
    return replace(problem, options=replace(options, time_budget_ms=ms), budget_reason=reason)
