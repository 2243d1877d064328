"""The length-class LP bound (solver_models.length_class_bound).

Its validity against the brute-force optimum is checked in tests/test_bound_oracle.py; here, on proven
mid-size optima of tests/fixtures/optima.json: it rises above the engine's bounds and the group-size LP
where memory-tight micro-batches idle, is near the optimum from its first classes, stays below the
optimum, never falls with more rounds, and keeps to its deadline.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from optimizer.bounds.lower_bounds import lower_bound
from optimizer.costs.tables import CostTables
from optimizer.problem.documents import problem_from_json

pytest.importorskip("highspy")
from solver_models import length_class_bound as lc  # noqa: E402
from solver_models.size_bound import size_bound  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "optima.json"


def _fixture(name: str) -> tuple[CostTables, float]:
    fixture = next(f for f in json.loads(FIXTURES.read_text())["fixtures"] if f["name"] == name)
    problem = problem_from_json(fixture["request"])
    assert problem.cost_profile.step_constant == 0.0  # the optimum is the micro-batches' alone
    return CostTables.build(problem), float(fixture["optimum_s"])


def test_rises_above_the_other_bounds_and_stays_below_the_optimum():
    # 32 ranks, 32 mixed samples, a large per-micro-batch constant: the engine's bounds and the
    # group-size LP sit 4.2% and 8.5% below the proven optimum.
    tables, optimum = _fixture("mixed-stress-group-constant-32x32-s0")
    others = max(lower_bound(tables), size_bound(tables) or 0.0)
    found = lc.length_class_bound(tables, optimum * 1.02, rounds=8)
    assert found is not None
    assert found.bound_s <= optimum * (1 + 1e-9)
    assert found.bound_s > others * 1.02
    assert found.bound_s > optimum * 0.99  # 0.99999 of it when measured
    fewer = lc.length_class_bound(tables, optimum * 1.02, rounds=3)
    assert fewer is not None and fewer.bound_s <= found.bound_s * (1 + 1e-12)
    assert found.classes > fewer.classes


def test_length_sums_make_the_first_round_tight():
    # 8 ranks, 16 video samples: on its 16 first classes the LP is within 1% of the proven optimum
    # (0.9975 of it when measured) because each class's micro-batches are charged the sum of their
    # lengths; charged only their class's short end, the same classes give 0.74 of it.
    tables, optimum = _fixture("video-analytical-8x16-s0")
    found = lc.length_class_bound(tables, optimum * 1.02, rounds=1)
    assert found is not None and found.rounds == 1 and found.classes <= lc.FIRST_CLASSES
    assert optimum * 0.99 < found.bound_s <= optimum * (1 + 1e-9)


def test_an_incumbent_caps_the_answer():
    tables, optimum = _fixture("mixed-stress-group-constant-32x32-s0")
    low = lower_bound(tables)
    found = lc.length_class_bound(tables, low, rounds=2)  # no plan is better than a bound: nothing to price
    assert found is None or found.bound_s <= low


def test_answers_nothing_past_its_deadline_or_without_an_incumbent(monkeypatch):
    tables, optimum = _fixture("mixed-stress-group-constant-32x32-s0")
    assert lc.length_class_bound(tables, optimum * 1.02, deadline=0.0, clock=lambda: 1.0) is None
    assert lc.length_class_bound(tables, math.inf) is None
    monkeypatch.setattr(lc, "_highs", lambda: None)
    assert lc.length_class_bound(tables, optimum * 1.02) is None
