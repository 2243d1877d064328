"""The group-column LP bound (solver_models.column_bound) on proven optima of tests/fixtures/optima.json.

Its validity against the brute-force optimum is checked in tests/test_bound_oracle.py; here: it converges,
stays below the proven optimum, is at least the length-class LP on the same classes (above it where whole
groups matter), gives the same bound when a plan's groups seed it, and answers with the Lagrangian bound
when its deadline stops it early.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from optimizer.costs.tables import CostTables
from optimizer.problem.documents import problem_from_json

pytest.importorskip("highspy")
from solver_models import column_bound as cb  # noqa: E402
from solver_models import length_class_bound as lc  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "optima.json"


def _fixture(name: str) -> tuple[CostTables, float, list[tuple[int, list[int]]]]:
    fixture = next(f for f in json.loads(FIXTURES.read_text())["fixtures"] if f["name"] == name)
    problem = problem_from_json(fixture["request"])
    assert problem.cost_profile.step_constant == 0.0  # the optimum is the micro-batches' alone
    groups = [(len(ranks), samples) for mb in fixture["groups"] for ranks, samples in mb]
    return CostTables.build(problem), float(fixture["optimum_s"]), groups


@pytest.mark.parametrize(
    "name",
    [
        "video-analytical-8x16-s0",
        "long-text-analytical-8x16-s0",
        "long-text-stress-group-constant-8x16-s0",
        "mixed-flexsp-gpt7b-8x16-s0",
    ],
)
def test_converges_below_the_optimum_and_at_least_the_class_lp(name):
    tables, optimum, _ = _fixture(name)
    found = cb.column_bound(tables, optimum * 1.02)
    classes = lc.length_class_bound(tables, optimum * 1.02, rounds=1)  # the same first classes
    assert found is not None and classes is not None
    assert found.converged and found.rounds == 1
    assert found.bound_s <= optimum * (1 + 1e-9)
    assert found.bound_s >= classes.bound_s * (1 - 1e-5)  # within the generation's tolerance


def test_whole_groups_raise_it_above_the_class_lp():
    # 8 ranks, 16 long-text samples: 0.9948 of the optimum against the class LP's 0.9941 when measured.
    tables, optimum, _ = _fixture("long-text-analytical-8x16-s0")
    found = cb.column_bound(tables, optimum * 1.02)
    classes = lc.length_class_bound(tables, optimum * 1.02, rounds=1)
    assert found is not None and classes is not None
    assert found.bound_s > classes.bound_s * 1.0004


def test_a_plans_groups_seed_the_same_bound():
    tables, optimum, groups = _fixture("video-analytical-8x16-s0")
    alone = cb.column_bound(tables, optimum * 1.02)
    seeded = cb.column_bound(tables, optimum * 1.02, groups=groups)
    assert alone is not None and seeded is not None and seeded.converged
    assert seeded.bound_s == pytest.approx(alone.bound_s, rel=1e-5)


def test_stopped_early_it_answers_the_lagrangian_bound():
    tables, optimum, _ = _fixture("video-analytical-8x16-s0")
    ticks = iter(range(10**6))
    found = cb.column_bound(tables, optimum * 1.02, deadline=3.0, clock=lambda: float(next(ticks)))
    assert found is not None and not found.converged
    assert found.bound_s <= optimum * (1 + 1e-9)


def test_answers_nothing_past_its_deadline_or_without_an_incumbent():
    tables, optimum, _ = _fixture("video-analytical-8x16-s0")
    assert cb.column_bound(tables, optimum * 1.02, deadline=0.0, clock=lambda: 1.0) is None
    assert cb.column_bound(tables, math.inf) is None
