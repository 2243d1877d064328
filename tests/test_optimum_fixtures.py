"""The proven optima of mid-size batches (``tests/fixtures/optima.json``, made by ``bench.optimum_fixtures``):
each stored plan verifies and costs its optimum, no bound of the engine lies above it, no plan is below it, and
what ``optimizer/presets/bound_tightness.json`` says of the bounds was measured on these optima."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optimizer.bounds import tightness
from optimizer.bounds.lower_bounds import bound_parts
from optimizer.costs.tables import CostTables
from optimizer.heuristic.strategies import heuristic_plan
from optimizer.plan.evaluate import assignment_step_time
from optimizer.plan.records import Assignment
from optimizer.problem.documents import problem_from_json
from optimizer.verify.verifier import check_assignment
from planning.planner import plan

FIXTURES = json.loads((Path(__file__).parent / "fixtures" / "optima.json").read_text())["fixtures"]
PROVEN = [f for f in FIXTURES if f.get("proven")]
REL = 1e-9


def test_the_fixtures_hold_proven_optima_of_several_profiles_and_sizes() -> None:
    assert len(PROVEN) >= 6
    assert len({f["case"]["profile"] for f in PROVEN}) >= 3
    assert len({f["case"]["ranks"] for f in PROVEN}) >= 2
    for f in PROVEN:  # a proof: the solver's bound meets the plan (less the rounding of times to model units)
        assert f["bound_s"] <= f["optimum_s"] * (1 + REL)
        assert f["bound_s"] >= f["optimum_s"] * (1 - 1e-5), f["name"]
        assert f["command"].startswith("python -m bench.optimum_fixtures --only " + f["name"])


@pytest.mark.parametrize("fixture", PROVEN, ids=[f["name"] for f in PROVEN])
def test_no_plan_or_bound_crosses_a_proven_optimum(fixture: dict) -> None:
    problem = problem_from_json(fixture["request"])
    tables = CostTables.build(problem)
    optimum = fixture["optimum_s"]
    stored = Assignment.of([[(ranks, samples) for ranks, samples in mb] for mb in fixture["groups"]])
    assert check_assignment(problem, stored).ok
    assert assignment_step_time(tables, stored) == pytest.approx(optimum, rel=REL)
    for name, value in bound_parts(tables).items():
        assert value <= optimum * (1 + REL), name
    assert assignment_step_time(tables, heuristic_plan(tables)) >= optimum * (1 - REL)
    answer = plan(problem.with_options(backend="auto", time_budget_ms=200.0, deterministic=True))
    assert answer.predicted_step_time_s >= optimum * (1 - REL)
    assert answer.lower_bound_s <= optimum * (1 + REL)
    binding = answer.solver.details["bound"]
    assert answer.solver.details.get("bound_tightness") == tightness.tightness_note(binding)


def test_bound_tightness_was_measured_on_these_optima() -> None:
    doc = json.loads(tightness.FILE.read_text())
    assert doc["cases"] == len(PROVEN)
    assert sum(b["binding"] for b in doc["bounds"].values()) == len(PROVEN)
    for name, b in doc["bounds"].items():
        assert 0.0 < b["loosest"] <= b["median"] <= 1.0 + REL, name
        note = tightness.tightness_note(name)
        assert note is not None and note.startswith(f"{name} was the binding bound on {b['binding']} of ")
    assert tightness.tightness_note("cpsat (proven by the solver)") is None
