"""The cyclic collector is paused while planning, runs again during solver calls and afterwards."""

from __future__ import annotations

import gc

from optimizer.gc_pause import collector_paused, collector_running


def test_pause_nests_and_restores() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
        with collector_running():
            assert gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_pause_keeps_a_disabled_collector_disabled() -> None:
    gc.disable()
    try:
        with collector_paused(), collector_running():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_plan_leaves_the_collector_enabled() -> None:
    from optimizer.problem.documents import problem_from_json
    from optimizer.problem.workloads import long_tail_video
    from planning.planner import plan

    plan(
        problem_from_json(
            {
                "batch": long_tail_video(16, seed=1),
                "cluster_preset": "h100-1x8",
                "model_preset": "qwen2-vl-7b",
                "options": {"backend": "heuristic"},
            }
        )
    )
    assert gc.isenabled()


def test_cpsat_models_leave_almost_no_cyclic_garbage() -> None:
    """OR-Tools' own model class sets about 60 self-referencing aliases on every instance; the planner's
    model class does not, so solving leaves only a handful of objects for the collector."""
    import pytest

    from solver_models import available_backends

    if "cpsat" not in available_backends():
        pytest.skip("cpsat is not installed")
    from ortools.sat.python import cp_model

    from optimizer.costs.tables import CostTables
    from optimizer.heuristic.strategies import heuristic_plan
    from optimizer.problem.documents import problem_from_json
    from optimizer.problem.workloads import long_tail_video
    from solver_models import cpsat
    from solver_models.formulation import full_model

    p = problem_from_json(
        {"batch": long_tail_video(6, seed=1), "cluster_preset": "h100-1x8", "model_preset": "qwen2-vl-7b"}
    )
    tables = CostTables.build(p)
    model = full_model(tables, heuristic_plan(tables), 1e9)
    gc.collect()
    gc.disable()
    try:
        cp_model.CpModel()  # the library's own class, for comparison
        stock = gc.collect()
        for _ in range(5):
            cpsat.solve_model(model, 1.0, p.options, None)
        ours = gc.collect()
    finally:
        gc.enable()
    assert stock >= 100, stock  # one stock model's aliases alone
    assert ours < stock, (ours, stock)  # five solves of ours leave less than one stock model


def test_the_solver_wait_collects_the_middle_generation_before_its_threshold() -> None:
    from planning import solve_watch

    gc.collect()
    gc.disable()
    try:
        threshold = gc.get_threshold()[1]
        while gc.get_count()[1] < threshold - solve_watch.MIDDLE_EARLY:
            gc.collect(0)
        solve_watch._collect_young()
        assert (
            gc.get_count()[1] == 0
        )  # the middle generation was collected here, not when the plan resumes the collector
    finally:
        gc.enable()


def test_a_pause_that_loads_a_module_freezes_what_is_alive(tmp_path, monkeypatch) -> None:
    """A library loaded by a plan lives as long as the process: the pause keeps it out of later full collections."""
    import importlib

    (tmp_path / "dhp_freshly_loaded.py").write_text("TABLE = [{'k': i} for i in range(1000)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = gc.get_freeze_count()
    try:
        with collector_paused():
            with collector_paused():
                module = importlib.import_module("dhp_freshly_loaded")
            # only the outermost pause freezes (frozen objects freed meanwhile, by another thread say, lower the count)
            assert gc.get_freeze_count() <= before
        assert gc.get_freeze_count() > before + len(module.TABLE)
        assert all(x is not module.TABLE for x in gc.get_objects())  # out of the collector's generations
        before = gc.get_freeze_count()
        with collector_paused():
            [{"k": i} for i in range(1000)]
        assert gc.get_freeze_count() <= before  # nothing loaded: nothing frozen
    finally:
        monkeypatch.delitem(__import__("sys").modules, "dhp_freshly_loaded")


def test_the_warm_up_leaves_full_collections_only_what_is_made_after_it() -> None:
    """In a fresh process: after the warm-up, a full collection walks almost nothing (module docstring)."""
    import subprocess
    import sys

    code = (
        "import gc\n"
        "from planning.planner import warm_up\n"
        "warm_up()\n"
        "print(gc.get_freeze_count(), len(gc.get_objects()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    frozen, tracked = map(int, out.stdout.split()[-2:])
    assert frozen > 20_000
    assert tracked < frozen / 20
