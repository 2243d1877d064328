"""The budget policy (planning.budget_policy): every phase's instant from the deadline and the problem's size.

The phases come in order and within the deadline; deterministic plans read no clock; the exact backend
is handed one deadline, the policy's, and the wait for it ends at the policy's hard stop; the backend is
chosen once per plan; each timing constant of the planner's layers is defined in one module, the
planning layer's in the policy itself. A budget of ``"auto"`` is a share of the previous step up to a cap, the
default without one, and the plan says what it came to.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from optimizer.costs.tables import CostTables
from optimizer.problem.documents import problem_from_json
from optimizer.problem.options import PlanOptions
from optimizer.problem.workloads import WORKLOADS
from planning import backends as backends_module
from planning import budget_policy, planner
from planning.budget_policy import (
    DETERMINISTIC_WAIT_BUDGETS,
    ESTIMATE_SAFETY,
    GRACE_MS,
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
    "planning/size_bound_step.py": {
        "HIGHS_LOAD_MS",
        "COLUMNS_PER_MS",
        "KINDS_COLUMNS_PER_MS",
        "LP_SETUP_MS",
    },  # the LP's cost
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


def test_the_heuristic_gets_the_same_instant_whether_or_not_a_solver_follows():
    """A backend starts from the plan the heuristic alone would have returned at that budget."""
    with fixed_rates(RATES):
        for backend in ("cpsat", "auto", "heuristic"):
            for budget_ms in (25.0, 200.0, 1000.0):
                budget, _, _ = budget_for(backend, budget_ms=budget_ms)
                assert budget.heuristic_due == pytest.approx(
                    min(budget.deadline.at(HEURISTIC_SHARE), budget.rescue.due)
                ), (backend, budget_ms)


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
        # the solver gets the whole budget from now, however late the heuristic ended
        assert window.due == pytest.approx(clock.now + 0.4)
        assert budget.solver_ms(window) == pytest.approx(400.0)


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


class Library(Recorder):
    """A backend whose library may be loaded in this process or not, and whose solves stop at deterministic
    limits in deterministic mode or on the clock."""

    def __init__(self, name: str, cold_ms: float, loaded: bool, deterministic_limits: bool = True) -> None:
        super().__init__()
        self.name, self.cold_ms, self.loaded = name, cold_ms, loaded
        self.deterministic_limits = deterministic_limits

    def load_ms(self) -> float:
        return 0.0 if self.loaded else self.cold_ms

    def cold_load_ms(self) -> float:
        return self.cold_ms


def test_deterministic_auto_counts_every_library_unloaded():
    """Whether OR-Tools is loaded in this process changes auto's pick in normal mode, never in deterministic
    mode: there every library counts as not loaded, so a short budget never picks the slowest to load."""
    tables = CostTables.build(problem("auto", 200.0))
    for loaded in (False, True):
        backends = {"cpsat": Library("cpsat", 400.0, loaded), "highs": Library("highs", 100.0, False)}
        picked = backends_module.choose_backend(tables, "auto", 200.0, backends, 10.0, deterministic=True)
        assert picked.name == "highs"
        normal = backends_module.choose_backend(tables, "auto", 200.0, backends, 10.0)
        assert normal.name == ("cpsat" if loaded else "highs")


def test_deterministic_auto_picks_only_backends_with_deterministic_limits():
    """A backend that stops on the clock answers by the machine's speed: deterministic auto passes it over,
    says why, and names the fixes; normal auto and a request by name still run it."""
    tables = CostTables.build(problem("auto", 2000.0))
    clocked = {"cpsat": Library("cpsat", 400.0, True, False), "highs": Library("highs", 100.0, True, False)}
    picked = backends_module.choose_backend(tables, "auto", 2000.0, clocked, 10.0, deterministic=True)
    assert picked.name == "heuristic"
    assert "highs stops on the clock" in picked.skip.why and "cpsat stops on the clock" in picked.skip.why
    assert "install OR-Tools" in picked.skip.instead and "by name" in picked.skip.instead
    assert backends_module.choose_backend(tables, "auto", 2000.0, clocked, 10.0).name == "cpsat"
    assert backends_module.choose_backend(tables, "highs", 2000.0, clocked, 10.0, deterministic=True).name == "highs"
    mixed = {**clocked, "cpsat": Library("cpsat", 400.0, False, True)}
    assert backends_module.choose_backend(tables, "auto", 2000.0, mixed, 10.0, deterministic=True).name == "cpsat"
    short = backends_module.choose_backend(tables, "auto", 200.0, mixed, 10.0, deterministic=True)
    assert short.name == "heuristic" and short.skip.need_ms is not None
    assert short.skip.instead is None  # a running service's loaded OR-Tools counts for nothing here


def test_only_cp_sat_of_the_built_in_backends_has_deterministic_limits():
    from solver_models.base import builtin_backends

    limits = {name: b.deterministic_limits for name, b in builtin_backends().items()}
    assert limits == {"cpsat": True, "highs": False, "cbc": False}


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


def test_auto_takes_a_share_of_the_previous_step_up_to_the_cap():
    from planning.budget_policy import AUTO_CAP_MS, AUTO_SHARE, auto_budget

    ms, why = auto_budget(1.84)
    assert ms == round(AUTO_SHARE * 1840.0) == 920.0
    assert why == '"auto": 0.5 x the previous step\'s 1.84 s = 920 ms'
    ms, why = auto_budget(60.0)  # an evaluation or a checkpoint made the step long
    assert ms == AUTO_CAP_MS and why.endswith("= 30000 ms, capped at 2000 ms")
    assert auto_budget(60.0, cap_ms=500.0)[0] == 500.0  # a service's lower limit
    ms, why = auto_budget(0.05, least_ms=80.4)  # a step shorter than the batch's fixed work
    assert ms == 81.0 and why.endswith("= 25 ms, raised to the 81 ms this batch needs here")
    assert auto_budget(0.001)[0] == 1.0  # never below the option's least


def test_auto_without_a_previous_step_is_the_default_and_says_so():
    from planning.budget_policy import auto_budget

    default = PlanOptions().time_budget_ms
    ms, why = auto_budget(None)
    assert ms == default == 200.0
    assert why == '"auto" without options.previous_step_s: the default 200 ms'
    assert auto_budget(None, cap_ms=150.0)[0] == 150.0


def test_a_numeric_budget_is_kept_and_previous_step_is_not_read():
    from planning.budget_policy import resolve_budget

    given = problem(budget_ms=300.0, previous_step_s=10.0)
    assert resolve_budget(given) is given
    assert given.budget_reason is None and given.options.budget_ms == 300.0


def test_auto_is_resolved_once_into_the_problem_at_least_what_the_batch_needs_unless_deterministic():
    from planning.budget_policy import resolve_budget

    asked = problem_from_json(
        {
            "batch": WORKLOADS["video"](96, seed=1),
            "cluster": {"nodes": 2, "gpus_per_node": 8},
            "model_preset": "qwen2-vl-7b",
            "options": {"backend": "heuristic", "time_budget_ms": "auto", "previous_step_s": 0.05},
        }
    )
    with pytest.raises(ValueError, match="resolve_budget"):
        asked.options.budget_ms  # noqa: B018 - no planning step may read an unresolved budget
    slow = Rates(
        base_ms=100.0, sample_ms=0.0, slot_ms=0.0, cell_ms=0.0, finish_ms=0.0, static_ms=0.0, tight_bound_ms=0.0
    )
    with fixed_rates(slow):  # the batch's fixed work: 70 ms here (LOW_SHARE of 100), above 0.5 x 50 ms
        raised = resolve_budget(asked)
    assert raised.options.budget_ms == 70.0 and raised.options.previous_step_s == 0.05
    assert (
        raised.budget_reason
        == '"auto": 0.5 x the previous step\'s 0.05 s = 25 ms, raised to the 70 ms this batch needs here'
    )
    assert resolve_budget(raised) is raised  # resolved once: the planner keeps what the service worked out
    with fixed_rates(slow):
        exact = resolve_budget(replace(asked, options=replace(asked.options, deterministic=True)))
    assert exact.options.budget_ms == 25.0  # deterministic plans are never refused, nor depend on this machine


def test_the_plan_records_its_budget_and_how_auto_came_to_it():
    asked = problem_from_json(
        {
            "batch": WORKLOADS["video"](96, seed=1),
            "cluster": {"nodes": 2, "gpus_per_node": 8},
            "model_preset": "qwen2-vl-7b",
            "options": {"backend": "heuristic", "time_budget_ms": "auto", "previous_step_s": 0.9},
        }
    )
    with fixed_rates(RATES):
        result = plan(asked)
        given = plan(problem("heuristic", budget_ms=300.0))
    solver = result.to_json(shards=False)["solver"]
    assert solver["budget_ms"] == 450.0
    assert solver["details"]["budget"] == '"auto": 0.5 x the previous step\'s 0.9 s = 450 ms'
    assert given.solver.budget_ms == 300.0 and "budget" not in given.solver.details
