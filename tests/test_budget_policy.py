"""The budget policy (planning.budget_policy): every phase's instant from the deadline and the problem's size.

The phases come in order and within the deadline; deterministic plans read no clock; the exact backend
is handed one deadline, the policy's, and the wait for it ends at the policy's hard stop; the backend is
chosen once per plan; each timing constant of the planner's layers is defined in one module, the
planning layer's in the policy itself.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

from optimizer.costs.tables import CostTables
from optimizer.problem.documents import problem_from_json
from optimizer.problem.workloads import WORKLOADS
from planning import backends as backends_module
from planning import budget_policy, planner
from planning.budget_policy import (
    DETERMINISTIC_WAIT_BUDGETS,
    ESTIMATE_SAFETY,
    GRACE_MS,
    HEURISTIC_ALONE_SHARE,
    HEURISTIC_SHARE,
    RESERVE_MS,
    SIZE_BOUND_SHARE,
    PhaseBudget,
    phase_budget,
)
from planning.deadline import Deadline
from planning.fixed_work import Rates, fixed_rates
from planning.planner import plan
from solver_models.base import SolveResult
from solver_models.cpsat import DETERMINISTIC_WALL_LIMITS
from solver_models.lns import DETERMINISTIC_ROUND_SHARE, DETERMINISTIC_WHOLE_SHARE

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("optimizer", "planning", "solver_models")
"""The planner's layers (engine, exact backends, orchestration), whose timing constants are checked."""
TIMING = re.compile(r"^[A-Z][A-Z0-9_]*(_MS|_S|SHARE|SAFETY|_BUDGETS|_LIMITS)$")
"""A timing constant's name: milliseconds, seconds, a share of a budget or a limit, a safety factor."""
ALGORITHM_OWN = {
    "planning/fixed_work.py": {"LOW_SHARE"},  # the estimate's spread, measured with the rates
    "planning/rates_cache.py": {"MAX_AGE_S"},  # how long measured rates are trusted
    "planning/size_bound_step.py": {"HIGHS_LOAD_MS", "COLUMNS_PER_MS", "LP_SETUP_MS"},  # the LP's cost
    "planning/solve_watch.py": {"POLL_S", "YOUNG_MARGIN_S", "EXIT_WAIT_S"},  # the waiting thread's collections
}
"""The planning layer's timing constants outside the policy: each is a detail of the one module that uses it."""
RATES = Rates(
    base_ms=1.0, sample_ms=0.01, slot_ms=0.0, cell_ms=0.0, finish_ms=0.02, static_ms=0.01, tight_bound_ms=0.05
)
"""Rates that make every reserve and estimate a few milliseconds (the machine's own would vary)."""


def problem(backend: str = "auto", budget_ms: float = 1000.0, **options):
    return problem_from_json(
        {
            "batch": WORKLOADS["video"](96, seed=1),
            "cluster": {"nodes": 2, "gpus_per_node": 8},
            "model_preset": "qwen2-vl-7b",
            "options": {"backend": backend, "time_budget_ms": budget_ms, **options},
        }
    )


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def budget_for(backend: str = "auto", budget_ms: float = 1000.0, **options) -> tuple[PhaseBudget, CostTables, Clock]:
    clock = Clock()
    tables = CostTables.build(problem(backend, budget_ms, **options))
    with fixed_rates(RATES):
        return phase_budget(Deadline.after_ms(budget_ms, clock=clock), tables), tables, clock


def test_the_phases_come_in_order_and_within_the_deadline():
    with fixed_rates(RATES):
        budget, tables, clock = budget_for()
        start, due = budget.deadline.start, budget.deadline.due
        window = budget.solver_window(tables, eval_ms=0.5)
        assert budget.heuristic_due is not None
        assert start < budget.tight_bounds_by <= budget.rescue.due
        assert start < budget.heuristic_due <= budget.rescue.due
        assert budget.rescue.due <= budget.finish_by < due
        assert start < window.due <= budget.finish_by
        # The wait for an answer ends before the request's deadline: the plan's last steps keep their time.
        assert window.hard_stop == pytest.approx(window.due + GRACE_MS / 1000.0)
        assert window.hard_stop <= due - RESERVE_MS / 1000.0
        assert budget.rescue.hard_stop <= due - RESERVE_MS / 1000.0
        assert window.reserve_ms == pytest.approx((due - window.due) * 1000.0)
        clock.now = start + 0.1
        lp_due = budget.size_bound_due(window, solver_follows=True)
        assert lp_due == pytest.approx(clock.now + SIZE_BOUND_SHARE * (window.due - clock.now))
        assert budget.size_bound_due(window, solver_follows=False) == pytest.approx(window.due)
        assert budget.reuse_due == due


def test_the_heuristic_leaves_room_for_a_solver_only_when_one_follows():
    with fixed_rates(RATES):
        for backend, share in (("cpsat", HEURISTIC_SHARE), ("heuristic", HEURISTIC_ALONE_SHARE)):
            budget, _, _ = budget_for(backend)
            assert budget.heuristic_due == pytest.approx(min(budget.deadline.at(share), budget.rescue.due))
        # A budget too short for a solver after the heuristic gives the heuristic nearly all of it.
        budget, _, _ = budget_for("cpsat", budget_ms=25.0)
        assert budget.heuristic_due == pytest.approx(min(budget.deadline.at(HEURISTIC_ALONE_SHARE), budget.rescue.due))


def test_an_optional_phase_starts_only_with_room_for_it():
    with fixed_rates(RATES):
        budget, tables, clock = budget_for()
        assert budget.room_for("static") is None and budget.room_for("tight_bound") is None
        assert budget.tight_bounds_first()
        # Just before the time kept for building and verifying, nothing optional fits.
        clock.now = budget.finish_by - 1e-4
        assert "it needs about" in (budget.room_for("tight_bound") or "")
        needs_s = ESTIMATE_SAFETY * 0.05 * tables.n_samples / 1000.0
        clock.now = budget.finish_by - 1.01 * needs_s
        assert budget.room_for("tight_bound") is None
        clock.now = budget.tight_bounds_by + 1e-6
        assert not budget.tight_bounds_first()


def test_deterministic_plans_read_no_clock():
    with fixed_rates(RATES):
        budget, tables, clock = budget_for(deterministic=True, budget_ms=400.0)
        clock.now = budget.deadline.due + 10.0  # long past the deadline: nothing changes
        assert budget.heuristic_due is None
        assert budget.tight_bounds_first()
        assert budget.room_for("static") is None and budget.room_for("tight_bound") is None
        window = budget.solver_window(tables, eval_ms=0.5)
        assert budget.size_bound_due(window, solver_follows=True) is None
        assert budget.reuse_due is None
        assert window.hard_stop == pytest.approx(window.due + DETERMINISTIC_WAIT_BUDGETS * 0.4)
        assert budget.rescue.hard_stop == pytest.approx(budget.rescue.due + DETERMINISTIC_WAIT_BUDGETS * 0.4)


def test_the_deterministic_wait_outlasts_cp_sat_s_own_wall_clock_caps():
    """The two deterministic safety factors are different quantities: CP-SAT's wall-clock cap per solve
    (in time limits) and the planner's wait (in budgets after the deadline); the wait covers the caps."""
    assert DETERMINISTIC_WALL_LIMITS / DETERMINISTIC_ROUND_SHARE < DETERMINISTIC_WAIT_BUDGETS  # neighbourhood rounds
    assert DETERMINISTIC_WALL_LIMITS * DETERMINISTIC_WHOLE_SHARE < DETERMINISTIC_WAIT_BUDGETS  # the whole model


class Recorder:
    """A backend that records the deadline it is handed and answers at once with nothing better."""

    name = "highs"

    def __init__(self) -> None:
        self.deadlines: list[float] = []

    def available(self) -> bool:
        return True

    def load_ms(self) -> float:
        return 0.0

    def solve(self, tables, options, hint, deadline, on_improvement=None):
        self.deadlines.append(deadline)
        return SolveResult(hint, "feasible")


def test_the_backend_is_handed_the_policy_s_one_deadline(monkeypatch):
    planner.warm_up()  # its own plans (once per process) come before the ones counted here
    windows, watched = [], []
    solver_window = PhaseBudget.solver_window
    solve_watched = backends_module.solve_watched

    def record_window(self, tables, eval_ms):
        windows.append(solver_window(self, tables, eval_ms))
        return windows[-1]

    def record_watch(name, backend, tables, hint, deadline, hard_stop, on_improvement, clock):
        watched.append((deadline, hard_stop))
        return solve_watched(name, backend, tables, hint, deadline, hard_stop, on_improvement, clock)

    monkeypatch.setattr(PhaseBudget, "solver_window", record_window)
    monkeypatch.setattr(backends_module, "solve_watched", record_watch)
    recorder = Recorder()
    p = problem("highs", 2000.0)
    with fixed_rates(RATES):
        deadline = Deadline.after_ms(2000.0)
        result = plan(p, deadline=deadline, backends={"highs": recorder})
    assert result.solver.backend == "highs"
    assert len(windows) == 1 and len(recorder.deadlines) == 1
    assert recorder.deadlines == [windows[0].due]
    assert watched == [(windows[0].due, windows[0].hard_stop)]
    assert windows[0].due <= deadline.due - (GRACE_MS + RESERVE_MS) / 1000.0


def test_the_backend_is_chosen_once_per_plan(monkeypatch):
    planner.warm_up()
    calls = []
    choose = planner.choose_backend

    def counted(*args, **kwargs):
        calls.append(args[1])
        return choose(*args, **kwargs)

    monkeypatch.setattr(planner, "choose_backend", counted)
    for backend in ("auto", "heuristic"):
        calls.clear()
        with fixed_rates(RATES):
            plan(problem(backend, 300.0))
        assert calls == [backend]


def _module_constants(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        names.update(t.id for t in targets if isinstance(t, ast.Name) and TIMING.match(t.id))
    return names


def _layer_files():
    for layer in LAYERS:
        yield from sorted((ROOT / layer).rglob("*.py"))


def test_each_timing_constant_is_defined_in_one_module():
    where = defaultdict(list)
    for path in _layer_files():
        for name in _module_constants(path):
            where[name].append(path.relative_to(ROOT).as_posix())
    assert {name: files for name, files in where.items() if len(files) > 1} == {}


def test_the_planning_layer_s_timing_constants_live_in_the_policy():
    policy = _module_constants(Path(budget_policy.__file__))
    assert {"GRACE_MS", "DETERMINISTIC_WAIT_BUDGETS", "ESTIMATE_SAFETY", "MIN_SOLVER_MS", "HEURISTIC_SHARE"} <= policy
    for path in sorted((ROOT / "planning").glob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel != "planning/budget_policy.py":
            assert _module_constants(path) <= ALGORITHM_OWN.get(rel, set()), rel


def test_the_planning_layer_reaches_into_no_algorithm_module_of_the_solvers():
    """planning imports the backends' interface (solver_models, its base, stop and size_bound modules),
    never a constant of an algorithm's module."""
    for path in sorted((ROOT / "planning").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert node.module not in ("solver_models.lns", "solver_models.cpsat", "solver_models.pulp_milp"), path


def test_solver_statistics_change_only_through_replace():
    for path in sorted((ROOT / "planning").glob("*.py")):
        assert "SolverStats(**" not in path.read_text(), path
