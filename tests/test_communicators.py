"""Communicator awareness: existing groups, options.group_reuse and the cost of a new group."""

from __future__ import annotations

from dataclasses import replace

import pytest

from optimizer.errors import ProblemError
from optimizer.problem.documents import problem_from_json
from optimizer.problem.workloads import WORKLOADS
from optimizer.verify.verifier import verify
from planning.planner import plan

BLOCKS = [list(range(a, a + d)) for d in (2, 4, 8) for a in range(0, 64, d)]


def request(existing=None, **options):
    doc = {"batch": WORKLOADS["mixed"](96, seed=1), "cluster_preset": "h100-8x8", "model_preset": "qwen2-vl-7b",
           "options": {"backend": "heuristic", **options}}
    if existing is not None:
        doc["existing_groups"] = existing
    return problem_from_json(doc)


def sizes(p):
    return {len(g.ranks) for mb in p.micro_batches for g in mb.groups}


def test_without_existing_groups_nothing_changes():
    p = plan(request())
    assert p.new_communicators is None and "new_communicators" not in p.to_json(shards=False)
    assert plan(request(group_reuse="ignore")).to_json(shards=False)["micro_batches"] == p.to_json(shards=False)["micro_batches"]


def test_prefer_reuses_and_reports_the_new_groups():
    plain = plan(request())
    p = plan(request(BLOCKS, group_reuse="prefer"))
    have = {tuple(b) for b in BLOCKS}
    assert set(p.new_communicators) == {c for c in p.communicators if c not in have}
    assert p.predicted_step_time_s <= plain.predicted_step_time_s * (1 + 1e-9)
    assert verify(p, request(BLOCKS, group_reuse="prefer")).ok


def test_a_costly_new_group_tips_prefer_towards_existing_groups():
    cheap = plan(request(BLOCKS, group_reuse="prefer"))
    assert cheap.new_communicators, "this batch should want group sizes the blocks lack"
    costly = plan(request(BLOCKS, group_reuse="prefer", new_group_cost_s=2.0))
    assert costly.predicted_step_time_s + costly.group_setup_s < cheap.predicted_step_time_s + 2.0 * len(cheap.new_communicators)
    assert costly.group_setup_s == pytest.approx(2.0 * len(costly.new_communicators))


@pytest.mark.parametrize("existing", [BLOCKS, [[0, 1, 2, 3], [2, 3, 4, 5], [6, 7], [8, 9, 10, 11, 12, 13, 14, 15]]])
def test_only_uses_nothing_but_existing_groups(existing):
    problem = request(existing, group_reuse="only", max_micro_batches=16)
    p = plan(problem)
    have = {tuple(sorted(g)) for g in existing}
    assert all(c in have for c in p.communicators)
    assert p.new_communicators == () and p.group_setup_s == 0
    assert sizes(p) <= {1} | {len(g) for g in existing}
    assert verify(p, problem).ok


def test_verify_catches_a_new_group_under_only_and_a_wrong_setup_cost():
    problem = request(BLOCKS, group_reuse="prefer", new_group_cost_s=1.0)
    p = plan(request(BLOCKS, group_reuse="prefer", new_group_cost_s=0.0))
    assert p.new_communicators
    report = verify(p, problem)
    assert any("group_setup_s" in v for v in report.violations)
    strict = problem.with_options(group_reuse="only")
    assert any("not an existing group" in v for v in verify(replace(p, group_setup_s=0.0), strict).violations)


@pytest.mark.parametrize("existing, field", [
    ({"a": 1}, "existing_groups"),
    ([[0, 1], []], "existing_groups[1]"),
    ([[0, 99]], "existing_groups[0]"),
    ([[3, 3]], "existing_groups[0]"),
])
def test_bad_existing_groups_name_the_field(existing, field):
    with pytest.raises(ProblemError) as exc:
        request(existing)
    assert exc.value.field == field


@pytest.mark.parametrize("options, field", [
    ({"group_reuse": "always"}, "options.group_reuse"),
    ({"new_group_cost_s": -1}, "options.new_group_cost_s"),
])
def test_bad_reuse_options_name_the_field(options, field):
    with pytest.raises(ProblemError) as exc:
        request(BLOCKS, **options)
    assert exc.value.field == field
