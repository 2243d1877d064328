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

    plan(problem_from_json({"batch": long_tail_video(16, seed=1), "cluster_preset": "h100-1x8", "model_preset": "qwen2-vl-7b",
                            "options": {"backend": "heuristic"}}))
    assert gc.isenabled()
