"""The verifier catches every kind of invalid plan."""

from __future__ import annotations

from dataclasses import replace

import pytest

from optimizer.documents import problem_from_json
from optimizer.plan import Assignment
from optimizer.planner import plan
from optimizer.verify import check_assignment, verify

PROFILE = {
    "time": {"quadratic": 1e-9, "linear": 1e-5, "sample_constant": 1e-3, "group_constant": 2e-3},
    "comm": {"scheme": "ring", "bytes_per_token": 1000.0, "bandwidth_bytes_per_s": {"intra": 1e9, "inter": 5e8}},
    "capacity_tokens_per_rank": 10000,
}


@pytest.fixture
def problem():
    samples = [{"id": f"s{i}", "text_tokens": t} for i, t in enumerate([500, 1200, 9000, 15000, 300])]
    return problem_from_json({"batch": {"samples": samples}, "cluster": {"nodes": 2, "gpus_per_node": 2}, "profile": PROFILE,
                              "options": {"backend": "heuristic", "degree_policy": "pow2", "max_micro_batches": 2}})


def violations(problem, mbs):
    return check_assignment(problem, Assignment.of(mbs)).violations


def test_valid_assignment_passes(problem):
    assert violations(problem, [[((0, 1), [3]), ((2,), [0, 1]), ((3,), [2, 4])]]) == []


@pytest.mark.parametrize(
    ("mbs", "needle"),
    [
        ([[((0, 1), [3]), ((2,), [0, 1]), ((3,), [2])]], "not planned"),
        ([[((0, 1), [3, 4]), ((2,), [0, 1, 4]), ((3,), [2])]], "more than once"),
        ([[((0, 1), [3]), ((1,), [0, 1]), ((3,), [2, 4])]], "already used"),
        ([[((0, 1, 2), [3]), ((3,), [0, 1, 2, 4])]], "not a power of two"),
        ([[((0, 9), [3]), ((2,), [0, 1]), ((3,), [2, 4])]], "outside"),
        ([[((0,), [3]), ((2,), [0, 1]), ((3,), [2, 4])]], "exceed the capacity"),
        ([[((0, 1), [3])], [((0,), [0])], [((1,), [1, 2, 4])]], "max_micro_batches"),
    ],
)
def test_violations_are_caught(problem, mbs, needle):
    found = violations(problem, mbs)
    assert any(needle in v for v in found), found


def test_plan_level_checks(problem):
    result = plan(problem)
    assert verify(result, problem).ok
    wrong_step = replace(result, predicted_step_time_s=result.predicted_step_time_s * 1.01)
    assert any("predicted step time" in v for v in verify(wrong_step, problem).violations)
    too_high = replace(result, lower_bound_s=result.predicted_step_time_s * 2)
    assert any("lower bound" in v for v in verify(too_high, problem).violations)
    mb = result.micro_batches[0]
    g = mb.groups[0]
    tampered = replace(result, micro_batches=(replace(mb, groups=(replace(g, predicted_time_s=g.predicted_time_s / 2),) + mb.groups[1:]),) + result.micro_batches[1:])
    assert any("recomputed" in v for v in verify(tampered, problem).violations)
