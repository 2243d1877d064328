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
    doc = {
        "batch": WORKLOADS["mixed"](96, seed=1),
        "cluster_preset": "h100-8x8",
        "model_preset": "qwen2-vl-7b",
        "options": {"backend": "heuristic", **options},
    }
    if existing is not None:
        doc["existing_groups"] = existing
    return problem_from_json(doc)


def sizes(p):
    return {len(g.ranks) for mb in p.micro_batches for g in mb.groups}


def test_without_existing_groups_nothing_changes():
    p = plan(request())
    assert p.new_communicators is None and "new_communicators" not in p.to_json(shards=False)
    assert (
        plan(request(group_reuse="ignore")).to_json(shards=False)["micro_batches"]
        == p.to_json(shards=False)["micro_batches"]
    )


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
    assert costly.predicted_step_time_s + costly.group_setup_s < cheap.predicted_step_time_s + 2.0 * len(
        cheap.new_communicators
    )
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


@pytest.mark.parametrize(
    "existing, field",
    [
        ({"a": 1}, "existing_groups"),
        ([[0, 1], []], "existing_groups[1]"),
        ([[0, 99]], "existing_groups[0]"),
        ([[3, 3]], "existing_groups[0]"),
    ],
)
def test_bad_existing_groups_name_the_field(existing, field):
    with pytest.raises(ProblemError) as exc:
        request(existing)
    assert exc.value.field == field


@pytest.mark.parametrize(
    "options, field",
    [
        ({"group_reuse": "always"}, "options.group_reuse"),
        ({"new_group_cost_s": -1}, "options.new_group_cost_s"),
    ],
)
def test_bad_reuse_options_name_the_field(options, field):
    with pytest.raises(ProblemError) as exc:
        request(BLOCKS, **options)
    assert exc.value.field == field


def _hand(existing, cost, groups, lengths):
    from optimizer.costs.tables import CostTables
    from optimizer.plan.records import Assignment

    doc = {
        "batch": {"samples": [{"id": f"s{i}", "text_tokens": n} for i, n in enumerate(lengths)]},
        "cluster": {"nodes": 1, "gpus_per_node": 8},
        "profile": {
            "time": {"quadratic": 1e-8, "linear": 1e-5, "sample_constant": 1e-3, "group_constant": 1e-3},
            "comm": {
                "scheme": "ring",
                "bytes_per_token": 100.0,
                "bandwidth_bytes_per_s": {"intra": 1e10, "inter": 1e9},
            },
            "capacity_tokens_per_rank": 4096,
        },
        "existing_groups": existing,
        "options": {"group_reuse": "prefer", "new_group_cost_s": cost},
    }
    return CostTables.build(problem_from_json(doc)), Assignment.of(groups)


def test_prefer_moves_a_new_group_onto_an_existing_group_of_another_size():
    from optimizer.plan.group_reuse import adapt

    # A larger existing group takes the samples when the micro-batch has ranks to spare (ranks 3, 6, 7 are idle).
    tables, a = _hand([[0, 1, 2, 3]], 0.5, [[((0, 1, 2), [0]), ((4,), [1]), ((5,), [2])]], [6000, 300, 200])
    out = adapt(tables, a)
    assert sorted(r for r, _ in out.micro_batches[0]) == [(0, 1, 2, 3), (4,), (5,)]
    # No spare rank: the group stays new.
    tables, a = _hand(
        [[0, 1, 2, 3]],
        0.5,
        [[((0, 1, 2), [0]), ((3,), [1]), ((4,), [2]), ((5,), [3]), ((6,), [4]), ((7,), [5])]],
        [6000, 300, 200, 100, 100, 100],
    )
    assert (0, 1, 2) in [r for r, _ in adapt(tables, a).micro_batches[0]]
    # A smaller existing group that holds the sample:
    # taken when the slowdown is below the cost of a new group, not otherwise.
    tables, a = _hand([[0, 1]], 0.5, [[((0, 1, 2), [0])]], [3000])
    assert [r for r, _ in adapt(tables, a).micro_batches[0]] == [(0, 1)]
    tables, a = _hand([[0, 1]], 1e-6, [[((0, 1, 2), [0])]], [3000])
    assert [r for r, _ in adapt(tables, a).micro_batches[0]] == [(0, 1, 2)]


def test_group_churn_bench_counts_new_groups_per_step():
    pytest.importorskip("torch")
    from trainer.group_churn import run

    out = run(steps=3, samples=24, workload="video", costs=(0.5,), budget_ms=100, cluster_preset="h100-1x8")
    runs = {r["mode"]: r for r in out["runs"]}
    assert set(runs) == {"blind", "ignore", "prefer", "prefer-blocks", "only"}
    assert (
        runs["only"]["new_groups_per_step"] == [0, 0, 0] and runs["only"]["created_at_start"] == 7
    )  # 4 + 2 + 1 aligned blocks of 8 ranks
    for r in runs.values():
        assert r["groups_created"] == r["created_at_start"] + sum(r["new_groups_per_step"])
        assert r["total_s"] == pytest.approx(r["total_step_s"] + r["groups_created"] * 0.5)
    assert runs["prefer"]["total_s"] <= runs["ignore"]["total_s"] * (1 + 1e-9)
