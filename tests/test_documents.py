"""Bad input gets an error naming the field and saying how to fix it."""

from __future__ import annotations

import pytest

from optimizer.errors import InfeasibleError, ProblemError
from optimizer.problem.documents import problem_from_json

BATCH = {"samples": [{"id": "a", "text_tokens": 100}]}


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({}, "batch"),
        ({"batch": {"samples": "x"}}, "batch.samples"),
        ({"batch": {"samples": []}}, "batch.samples"),
        ({"batch": {"samples": [{"id": "a", "text_tokens": -1}]}}, "batch.samples[0].text_tokens"),
        ({"batch": {"samples": [{"id": "a", "text_tokens": 1.5}]}}, "batch.samples[0].text_tokens"),
        ({"batch": {"samples": [{"id": "a", "images": [{"tokens": 0}]}]}}, "batch.samples[0].images[0].tokens"),
        ({"batch": {"samples": [{"id": "a", "text_tokens": 5, "colour": 1}]}}, "batch.samples[0]"),
        ({"batch": {"samples": [{"id": "a", "text_tokens": 5}, {"id": "a", "text_tokens": 5}]}}, "batch.samples[1].id"),
        (
            {"batch": {"samples": [{"id": "a", "images": [{"width": 10, "height": 10}]}]}, "model_preset": "llama3-8b"},
            "batch.samples[0].images[0]",
        ),
        ({"batch": BATCH, "cluster_preset": "nope"}, "cluster_preset"),
        ({"batch": BATCH, "model_preset": "nope"}, "model_preset"),
        ({"batch": BATCH, "cluster": {"nodes": 0}}, "cluster.nodes"),
        ({"batch": BATCH, "cluster": {"nodes": 2, "gpus_per_node": 8, "tensor_parallel": 3}}, "cluster.nodes[0].gpus"),
        ({"batch": BATCH, "cluster": {"nodes": 1, "gpu": "TPU"}}, "cluster.gpu"),
        ({"batch": BATCH, "options": {"time_budget_ms": 0}}, "options.time_budget_ms"),
        ({"batch": BATCH, "options": {"degree_policy": "odd"}}, "options.degree_policy"),
        ({"batch": BATCH, "options": {"max_micro_batches": True}}, "options.max_micro_batches"),
        ({"batch": BATCH, "profile": {"time": {}}}, "profile.comm"),
        (
            {
                "batch": BATCH,
                "profile": {
                    "time": {},
                    "capacity_tokens_per_rank": 10,
                    "comm": {"scheme": "ring", "bytes_per_token": 1, "bandwidth_bytes_per_s": {"intra": 1, "inter": 1}},
                },
            },
            "profile.time.quadratic",
        ),
        (
            {
                "batch": BATCH,
                "model": {
                    "llm": {"layers": 2, "hidden": 100, "heads": 3, "ffn_hidden": 10, "vocab": 10, "parameters": 1e6}
                },
            },
            "model.llm.heads",
        ),
        ({"batch": BATCH, "cluster": {"nodes": 1}, "cluster_preset": "h100-8x8"}, "cluster_preset"),
        ([1, 2], "request"),
    ],
)
def test_bad_input_names_the_field(doc, field):
    with pytest.raises(ProblemError) as info:
        problem_from_json(doc)
    err = info.value
    assert err.field == field, str(err)
    assert err.hint, "every error says how to fix it"


def test_profile_bandwidth_table_errors():
    prof = {
        "time": {"quadratic": 1e-9, "linear": 1e-5, "sample_constant": 0, "group_constant": 0},
        "comm": {
            "scheme": "ring",
            "bytes_per_token": 1,
            "bandwidth_bytes_per_s": {"intra": {"two": 1e9}, "inter": 1e9},
        },
        "capacity_tokens_per_rank": 1000,
    }
    with pytest.raises(ProblemError) as info:
        problem_from_json({"batch": BATCH, "profile": prof})
    assert info.value.field == "profile.comm.bandwidth_bytes_per_s.intra"


def test_sample_too_long_is_infeasible_with_a_hint():
    from planning.planner import plan

    doc = {
        "batch": {"samples": [{"id": "huge", "text_tokens": 10_000_000}]},
        "cluster": {"nodes": 1, "gpus_per_node": 8},
        "model_preset": "qwen2-vl-7b",
    }
    with pytest.raises(InfeasibleError) as info:
        plan(problem_from_json(doc))
    assert "huge" in info.value.message and info.value.hint


def test_model_that_does_not_fit_is_infeasible_with_a_hint():
    from planning.planner import plan

    doc = {"batch": BATCH, "cluster": {"nodes": 1, "gpus_per_node": 2}, "model_preset": "llama3-8b"}
    with pytest.raises(InfeasibleError) as info:
        plan(problem_from_json(doc))
    assert info.value.field == "model.training.zero_stage" and "zero_stage 3" in info.value.hint


def test_shorthand_cluster_and_mixed_cluster():
    p = problem_from_json({"batch": BATCH, "cluster": {"nodes": 3, "gpus_per_node": 4}})
    assert p.cluster.domain_size == 12 and p.cluster.rank_node == (0,) * 4 + (1,) * 4 + (2,) * 4
    mixed = problem_from_json({"batch": BATCH, "cluster_preset": "mixed-h100-a100"})
    assert not mixed.cluster.homogeneous
    tp = problem_from_json(
        {"batch": BATCH, "cluster": {"nodes": 2, "gpus_per_node": 8, "tensor_parallel": 2, "pipeline_parallel": 2}}
    )
    # 16 GPUs / (TP 2 x PP 2) = 4 ranks; pipeline stage 0 is node 0, so every planned rank is there.
    assert tp.cluster.domain_size == 4 and tp.cluster.rank_node == (0, 0, 0, 0)


def test_fast_and_general_sample_paths_agree(monkeypatch):
    import optimizer.problem.documents as documents
    from optimizer.problem.workloads import WORKLOADS

    extra = {
        "samples": [
            {"id": "v", "videos": [{"frames": 8, "tokens": 1000}]},
            {"id": "w", "videos": [{"frames": 3, "tokens_per_frame": 196}], "images": [{"tokens": 5, "frames": 2}]},
            {"id": "t", "text_tokens": 7},
        ]
    }
    docs = [gen(40, seed=1) for gen in WORKLOADS.values()] + [extra]
    fast = [documents.batch_from_json(d) for d in docs]
    monkeypatch.setattr(documents, "_sample_fast", lambda s: None)
    general = [documents.batch_from_json(d) for d in docs]
    assert fast == general
    assert [s.length for b in fast for s in b.samples] == [s.length for b in general for s in b.samples]


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"batch": {"samples": [{"id": "a", "text_tokens": 10**30}]}}, "batch.samples[0].text_tokens"),
        (
            {"batch": {"samples": [{"id": "a", "images": [{"tokens": 10**20, "frames": 2}]}]}},
            "batch.samples[0].images[0].tokens",
        ),
        ({"batch": BATCH, "cluster": {"nodes": 10**12}}, "cluster.nodes"),
        ({"batch": BATCH, "cluster": {"nodes": 10**6}}, "cluster.nodes"),
        ({"batch": BATCH, "cluster": {"nodes": 2, "gpus_per_node": 5000}}, "cluster.gpus_per_node"),
        ({"batch": BATCH, "cluster": {"nodes": [{"count": 200_000, "gpus": 8}]}}, "cluster.nodes[0]"),
        (
            {
                "batch": BATCH,
                "model": {
                    "llm": {"layers": 10**40, "hidden": 64, "heads": 1, "ffn_hidden": 1, "vocab": 1, "parameters": 1}
                },
            },
            "model.llm.layers",
        ),
    ],
)
def test_huge_numbers_are_refused_not_overflowed(doc, field):
    with pytest.raises(ProblemError) as info:
        problem_from_json(doc)
    assert info.value.field == field and info.value.hint
