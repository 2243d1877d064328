"""bench.optimum_gap on the fixtures whose proof did not close: the length-class LP says how much of each gap
is known to be the plan's."""

from __future__ import annotations

import json

import pytest

from bench import optimum_gap
from bench.optimum_fixtures import FIXTURES

pytest.importorskip("highspy")


def test_the_class_lp_narrows_an_unproven_gap(capsys):
    # 16 ranks, 32 long-text samples under FlexSP's 7B fit: CP-SAT stopped at 1.0354 of its bound after
    # 120 s; below the same plan the length-class LP leaves 1.0038 when measured.
    fixture = next(
        f for f in json.loads(FIXTURES.read_text())["fixtures"] if f["name"] == "long-text-flexsp-gpt7b-16x32-s0"
    )
    assert not fixture["proven"]
    (row,) = optimum_gap.unproven_gaps([fixture])
    assert row["over_solver_bound"] == pytest.approx(fixture["best_s"] / fixture["bound_s"])
    assert 1.0 <= row["over_class_bound"] < row["over_solver_bound"]
    optimum_gap.report({"cases": []}, [row])
    assert f"long-text-flexsp-gpt7b-16x32-s0: {row['over_solver_bound']:.4f}" in capsys.readouterr().out
