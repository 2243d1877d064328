"""``bench.refit_trainer``'s repeated evaluations: a step's measured time is the median of the runs that ran
its plan."""

from __future__ import annotations

import pytest

from bench.refit_trainer import errors, median_run


def _run(times: list[float], digests: list[str]) -> dict:
    rows = [{"predicted_s": 1.0, "measured_s": t, "digest": d} for t, d in zip(times, digests, strict=True)]
    return {"steps": rows}


def test_median_run_takes_each_steps_median_over_runs_of_the_same_plan() -> None:
    runs = [_run([1.0, 2.0], ["a", "b"]), _run([1.2, 9.0], ["a", "c"]), _run([0.9, 2.2], ["a", "b"])]
    merged = median_run(runs)
    first, second = merged["steps"]
    assert first["measured_s"] == 1.0 and first["repeats"] == 3
    assert first["spread"] == pytest.approx((0.0 + 0.2 + 0.1) / 3)
    assert second["measured_s"] == pytest.approx(2.1) and second["repeats"] == 2  # run 2 planned "c"
    assert errors(merged, 0)["mean_error"] == pytest.approx((0.0 + abs(1 / 2.1 - 1)) / 2)
