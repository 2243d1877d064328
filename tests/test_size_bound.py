"""The group-size LP bound (solver_models.size_bound) and how the planner runs it.

Its validity against the brute-force optimum is checked in tests/test_bound_oracle.py; here: it
raises the bound where memory-tight micro-batches waste the memory of wide groups, stays below the
verified plan, keeps to its deadline, and the planner runs it only when it may pay, is wanted (before an
exact backend, or asked for with options.tight_bound) and time allows.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench.grid import make_problem, resolve_profile
from bench.workload_catalog import WORKLOADS
from optimizer.bounds.lower_bounds import lower_bound
from optimizer.costs.tables import CostTables
from optimizer.verify.verifier import verify
from planning import size_bound_step
from planning.budget_policy import SolveWindow, phase_budget
from planning.deadline import Deadline
from planning.planner import plan

pytest.importorskip("highspy")
from solver_models import size_bound as sb  # noqa: E402


def _case(budget_ms: float = 200.0, **options):
    # FlexSP's GPT-7B fit, long text on 64 ranks: six micro-batches by memory, a 0.63 s constant
    # per group, samples of 17 ranks' memory on groups of 32.
    problem = make_problem(WORKLOADS["long-text"], 64, 512, 2, budget_ms, resolve_profile("flexsp-gpt7b"))
    return problem.with_options(**options) if options else problem


def test_raises_the_bound_and_stays_below_the_verified_plan():
    problem = _case(backend="heuristic")
    tables = CostTables.build(problem)
    result = plan(problem.with_options(deterministic=True))  # the plan alone, without the LP
    report = verify(result, problem)
    assert report.ok, report.violations
    engine = lower_bound(tables)
    lp = sb.size_bound(tables)
    assert lp is not None
    assert lp > engine * 1.01  # 18.08 s to 18.48 s when measured
    assert lp <= report.step_time_s - problem.cost_profile.step_constant
    # The incumbent's step time only removes choices no better plan makes: never a lower bound.
    assert sb.size_bound(tables, report.step_time_s) >= lp * (1 - 1e-9)


def test_the_quarters_row_counts_groups_that_memory_alone_misses(monkeypatch):
    """On the same batch, the rows that weigh samples by the quarters of a group's memory they take raise
    the LP (18.40 s without them, 18.48 s with them when measured); the oracle tests check them valid."""
    tables = CostTables.build(_case())
    with_rows = sb.size_bound(tables)
    monkeypatch.setattr(sb, "quarters", lambda share: np.zeros_like(share))
    without = sb.size_bound(tables)
    assert with_rows is not None and without is not None
    assert with_rows > without * 1.002


def test_the_quarters_weights_never_overfill_a_group():
    """Any samples that fit a group's memory together weigh at most 1 (the row's premise), on the edges of
    the steps and on random fills; past the fills, four samples past a quarter weigh more than 1."""
    shares = np.array([0.25, 0.25 + 1e-9, 0.5, 0.5 + 1e-9, 0.75, 0.75 + 1e-9, 1.0])
    assert sb.quarters(shares).tolist() == pytest.approx([0, 1 / 3, 1 / 3, 2 / 3, 2 / 3, 1, 1])
    rng = np.random.default_rng(0)
    for _ in range(2000):
        parts = rng.dirichlet(np.ones(rng.integers(1, 6))) * rng.uniform(0.5, 1.0)
        assert sb.quarters(parts).sum() <= 1 + 1e-12, parts
    assert sb.quarters(np.full(4, 0.26)).sum() > 1


def test_an_incumbent_drops_the_sizes_that_would_leave_the_others_too_little_time(monkeypatch):
    """Below a plan's step time, the LP drops a sample's sizes whose micro-batch and the others' least work
    reach it (FlexSP's 7B fit, mixed workload on 256 ranks: 4.98 s without the others' work, 5.06 s with
    it, under a plan of 5.34 s, when measured)."""
    problem = make_problem(WORKLOADS["mixed"], 256, 512, 0, 1000.0, resolve_profile("flexsp-gpt7b"))
    tables = CostTables.build(problem)
    upper = verify(plan(problem.with_options(deterministic=True)), problem).step_time_s
    with_wait = sb.size_bound(tables, upper)
    monkeypatch.setattr(sb, "others_wait", lambda t, least: np.zeros_like(least))
    without = sb.size_bound(tables, upper)
    assert with_wait is not None and without is not None
    assert without * 1.003 < with_wait <= upper


def test_answers_nothing_past_its_deadline():
    tables = CostTables.build(_case())
    assert sb.size_bound(tables, deadline=0.0, clock=lambda: 1.0) is None


def test_without_highs_the_plan_keeps_the_engine_bound(monkeypatch):
    monkeypatch.setattr(sb, "_highs", lambda: None)
    result = plan(_case(1000.0, backend="heuristic", tight_bound=True))
    assert result.solver.details["bound"] != "group_sizes"
    assert "size_bound_ms" not in result.solver.details["phases"]


def test_the_planner_reports_it_as_the_binding_bound():
    problem = _case(1000.0, backend="heuristic", tight_bound=True)
    result = plan(problem)
    assert result.solver.details["bound"] == "group_sizes"
    assert "size_bound_ms" in result.solver.details["phases"]
    engine = lower_bound(CostTables.build(problem)) + problem.cost_profile.step_constant
    assert result.lower_bound_s > engine * 1.01
    assert result.lower_bound_s <= result.predicted_step_time_s


def _lp_within(tables, upper_s, deadline, solver_follows):
    """The LP step by the instant the budget policy gives it, 5 ms kept back after the solver's deadline."""
    window = SolveWindow(deadline.due - 0.005, deadline.due, 5.0)
    due = phase_budget(deadline, tables).size_bound_due(window, solver_follows)
    return size_bound_step.size_bound_within(tables, upper_s, 10.0, due, deadline.clock)


def test_skipped_when_the_gap_is_small_deterministic_or_out_of_time(monkeypatch):
    tables = CostTables.build(_case())
    roomy = Deadline.after_ms(10_000.0)
    assert _lp_within(tables, 10.05, roomy, True) is None  # 0.5% gap
    deterministic = CostTables.build(_case(deterministic=True))
    assert _lp_within(deterministic, 20.0, roomy, True) is None  # deterministic
    spent = Deadline.after_ms(0.0)
    assert _lp_within(tables, 20.0, spent, False) is None
    got = _lp_within(tables, 20.0, roomy, True)
    assert got is not None and math.isfinite(got)
    # An LP larger than the time allows to build is not started.
    monkeypatch.setattr(size_bound_step, "COLUMNS_PER_MS", 1e-3)
    assert _lp_within(tables, 20.0, roomy, True) is None


def _counting(monkeypatch) -> list[int]:
    """The calls of the LP (one per plan that runs it), counted without timing anything."""
    calls: list[int] = []
    real = sb.size_bound

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sb, "size_bound", counted)
    return calls


def test_the_heuristic_alone_runs_no_lp_unless_asked(monkeypatch):
    from optimizer.heuristic import long_head
    from planning.planner import warm_up

    warm_up()  # the warm-up's own plans run the LP; counted from here, only this test's are
    calls = _counting(monkeypatch)
    # Without the long head's second pass, which searches until the deadline: both plans then get the
    # same search however much time the LP takes (deterministic mode would run the LP unasked).
    monkeypatch.setattr(long_head, "PLANNED_WIDER", long_head.PLANNED)
    monkeypatch.setattr(long_head, "QUICK", 0)
    problem = _case(1000.0, backend="heuristic")
    result = plan(problem)
    assert calls == []
    assert "size_bound_ms" not in result.solver.details["phases"]
    assert result.solver.details["skipped"]["group_size_bound"] == size_bound_step.NOT_ASKED
    asked = plan(problem.with_options(tight_bound=True))
    assert calls == [1]
    assert asked.solver.details["bound"] == "group_sizes"
    assert "group_size_bound" not in asked.solver.details.get("skipped", {})
    # The plan itself is the same: the LP only raises the bound.
    assert asked.to_json(shards=False)["micro_batches"] == result.to_json(shards=False)["micro_batches"]


def test_deterministic_plans_run_no_lp_and_say_so_when_it_was_asked_for(monkeypatch):
    calls = _counting(monkeypatch)
    quiet = plan(_case(1000.0, backend="heuristic", deterministic=True))
    asked = plan(_case(1000.0, backend="heuristic", deterministic=True, tight_bound=True))
    assert calls == []
    assert "skipped" not in quiet.solver.details
    assert asked.solver.details["skipped"]["group_size_bound"] == size_bound_step.DETERMINISTIC


def test_skip_reasons_follow_the_backend_the_gap_and_the_options():
    options = _case().options
    skipped = size_bound_step.size_bound_skipped
    assert skipped(options, "heuristic", 20.0, 10.0) == size_bound_step.NOT_ASKED
    assert skipped(options, "heuristic", 10.05, 10.0) is None  # a gap under 1%: nothing to tell
    assert skipped(options, "highs", 20.0, 10.0) is None  # before an exact backend, when time allows
    assert skipped(_case(tight_bound=True).options, "heuristic", 20.0, 10.0) is None


def test_tight_bound_is_a_checked_option_with_a_flag():
    from api.cli.main import parser
    from api.cli.request_flags import request_parts
    from optimizer.errors import ProblemError
    from optimizer.problem.documents import options_from_json

    assert options_from_json({"tight_bound": True}).tight_bound is True
    assert options_from_json({}).tight_bound is False
    assert options_from_json({"tight_bound": None}).tight_bound is False  # null: the default, as for every option
    for wrong in ("yes", 1, 0):
        with pytest.raises(ProblemError) as err:
            options_from_json({"tight_bound": wrong})
        assert err.value.field == "options.tight_bound" and err.value.hint
    args = parser().parse_args(["plan", "--batch", "batch.json", "--tight-bound"])
    assert request_parts(args)["options"] == {"tight_bound": True}
    assert "options" not in request_parts(parser().parse_args(["plan", "--batch", "batch.json"]))
