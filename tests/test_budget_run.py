"""Budgets honoured whatever the backend: a backend that ignores its deadline is stopped there, the
built-in solvers end their work when stopped, their limits count the model's building, and a small
run of the budget benchmark (``bench.budget_run``) gives valid plans only.

Speed is the benchmark's to show; the only timed assertion is the hard stop of a backend that would
otherwise hold the plan for seconds, with a generous margin for a busy machine.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest

from bench import budget_run
from optimizer.costs.tables import CostTables
from optimizer.heuristic.strategies import heuristic_plan
from optimizer.problem.documents import problem_from_json
from optimizer.problem.workloads import WORKLOADS
from optimizer.verify.verifier import verify
from planning import solve_watch
from planning.planner import plan, warm_up
from solver_models import available_backends, builtin_backends
from solver_models.base import SolveResult
from solver_models.formulation import full_model
from solver_models.lns import FULL_MODEL_PAIRS, full_model_pairs

BUDGET_MS = 150.0


def problem(n: int = 48, nodes: int = 2, per_node: int = 8, **options):
    doc = {
        "batch": WORKLOADS["video"](n, seed=1),
        "cluster": {"nodes": nodes, "gpus_per_node": per_node},
        "model_preset": "qwen2-vl-7b",
        "options": {"backend": "cpsat", "time_budget_ms": BUDGET_MS, **options},
    }
    return problem_from_json(doc)


class Deaf:
    """A backend that ignores its deadline and its stop signal: it answers when the test lets it."""

    name = "cpsat"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def available(self) -> bool:
        return True

    def load_ms(self) -> float:
        return 0.0

    def solve(self, tables, options, hint, deadline, on_improvement=None):
        self.calls += 1
        self.release.wait(30.0)
        return SolveResult(hint, "feasible")


@pytest.fixture
def deaf():
    # Solves that earlier tests stopped at their deadlines may still be running on a loaded machine; while
    # MAX_LATE of them run the planner rightly starts no other solve of that backend, so wait them out first.
    assert solve_watch.settle(60.0)
    backend = Deaf()
    yield backend
    backend.release.set()
    assert solve_watch.settle(10.0)


def test_a_backend_that_ignores_its_deadline_is_stopped_there(deaf):
    p = problem()
    warm_up()  # loading the compiled kernels (once per process) comes before the budget starts
    start = time.perf_counter()
    result = plan(p, backends={"cpsat": deaf})
    wall_ms = (time.perf_counter() - start) * 1000.0
    # Without the stop the call would last until the test releases the backend (30 s).
    assert wall_ms < BUDGET_MS + 500.0, wall_ms
    assert result.solver.status == "stopped" and result.solver.backend == "cpsat"
    assert "stopped at the deadline" in result.solver.fallback_reason
    assert verify(result, p).ok
    assert result.predicted_step_time_s == pytest.approx(
        result.solver.trace[0].objective_s
    )  # the heuristic's plan, the best found


def test_a_stuck_backend_is_not_started_again_while_its_stopped_solves_run(deaf):
    p = problem()
    for _ in range(solve_watch.MAX_LATE):
        assert plan(p, backends={"cpsat": deaf}).solver.status == "stopped"
    assert solve_watch.busy("cpsat")
    result = plan(p, backends={"cpsat": deaf})
    assert deaf.calls == solve_watch.MAX_LATE  # not started a third time
    assert result.solver.status == "fallback" and "still running" in result.solver.fallback_reason
    deaf.release.set()
    assert solve_watch.settle(10.0)
    assert not solve_watch.busy("cpsat")


@pytest.mark.parametrize("deterministic", [True, False])
def test_only_deterministic_plans_wait_for_a_late_answer(deterministic):
    class Late:
        name = "cpsat"
        calls = 0

        def available(self):
            return True

        def load_ms(self):
            return 0.0

        def solve(self, tables, options, hint, deadline, on_improvement=None):
            self.calls += 1
            time.sleep(max(0.0, deadline - time.perf_counter()) + 0.1)  # 100 ms past its deadline
            return SolveResult(hint, "feasible")

    late = Late()
    result = plan(problem(deterministic=deterministic, time_budget_ms=400.0), backends={"cpsat": late})
    assert late.calls == 1
    # The clock decides nothing in deterministic mode (up to a safety net of a few budgets).
    assert result.solver.status == ("feasible" if deterministic else "stopped")
    assert solve_watch.settle(5.0)


def _hard_case(mode: str):
    if mode == "full":  # 12 samples on 8 ranks: one whole model, none of the solvers proves it within seconds
        p = problem_from_json(
            {
                "batch": WORKLOADS["image-sft"](12, seed=1),
                "cluster": {"nodes": 1, "gpus_per_node": 8},
                "model_preset": "qwen2-vl-7b",
            }
        )
    else:
        p = problem_from_json(
            {
                "batch": WORKLOADS["image-sft"](24, seed=1),
                "cluster": {"nodes": 2, "gpus_per_node": 8},
                "model_preset": "qwen2-vl-7b",
            }
        )
    tables = CostTables.build(p)
    assert (full_model_pairs(tables) <= FULL_MODEL_PAIRS) == (mode == "full")
    return tables, heuristic_plan(tables)


@pytest.mark.parametrize("mode", ["full", "lns"])
@pytest.mark.parametrize("name", ["cpsat", "highs", "cbc"])
def test_builtin_backends_end_their_work_when_stopped(name, mode):
    if name not in available_backends():
        pytest.skip(f"{name} is not installed")
    tables, hint = _hard_case(mode)
    now = time.perf_counter()
    # Left alone, the solve would run its full 4 s (measured for every case here); it is stopped after 0.3 s.
    watched = solve_watch.solve_watched(
        name, builtin_backends()[name], tables, hint, now + 4.0, now + 0.3, None, time.perf_counter
    )
    assert watched.stopped
    assert solve_watch.settle(2.0), f"{name} ({mode}) still running 2 s after it was stopped"


@pytest.mark.parametrize("name", ["cpsat", "highs", "cbc"])
def test_a_solver_limit_counts_the_building_of_its_model(name):
    if name not in available_backends():
        pytest.skip(f"{name} is not installed")
    from solver_models import cpsat, pulp_milp

    tables, hint = _hard_case("full")
    model = full_model(tables, hint, 1e9)
    options = tables.problem.options
    solve = cpsat.solve_model if name == "cpsat" else (lambda m, s, o, cb=None: pulp_milp._solve_with(name, m, s, o))
    result = solve(model, 0.002, options, None)  # the model takes longer than 2 ms to build: nothing is left to solve
    assert result.status == "timeout" and result.y is None
    assert "no time left" in (result.message or "")


def test_a_small_budget_run_gives_valid_plans_only(tmp_path: Path, deaf):
    records, summary = budget_run.run(4, seed=11, show_progress=False)
    drawn = (budget_run.draw_case(i, 11) for i in range(100))
    case = next(
        c for c in drawn if c.backend == "cpsat" and c.budget_ms >= 200.0
    )  # time left for the solver after the heuristic
    records.append(budget_run.run_python(case, backends={"cpsat": deaf}))
    records.append(budget_run.run_cli(budget_run.draw_case(5, 11), tmp_path))
    summary = budget_run.summarise(records, 20.0)
    assert summary["invalid"] == 0 and summary["errors"] == 0, [
        r.note for r in records if r.outcome != "plan" or r.valid is False
    ]
    assert summary["plans"] + summary["refused"] == len(records) == 6
    assert records[4].solver_status == "stopped"
    assert records[5].via == "cli" and not math.isnan(records[5].wall_ms)
    assert all(
        r.plan_ms is not None and r.plan_ms <= r.wall_ms for r in records[:5]
    )  # the plan's own clock, inside the call's
    assert sum(v["calls"] for v in summary["by_backend"].values()) == 6


def test_a_neighbourhood_whose_hinted_times_pass_the_bound_still_solves():
    """Times rounded up to the model's units can put a neighbourhood's hinted micro-batch time above the
    incumbent's bound: HiGHS then starts without the hint instead of failing every round."""
    if "highs" not in available_backends():
        pytest.skip("highs is not installed")
    p = problem_from_json(
        {
            "batch": WORKLOADS["image-sft"](600, seed=0),
            "cluster": {"nodes": 16, "gpus_per_node": 8},
            "model_preset": "qwen2-vl-7b",
        }
    )
    tables = CostTables.build(p)
    result = builtin_backends()["highs"].solve(tables, p.options, heuristic_plan(tables), time.perf_counter() + 0.6)
    assert result.details["mode"] == "lns" and result.details["rounds"] >= 1
    assert "errors" not in result.details, result.details.get("last_error")
