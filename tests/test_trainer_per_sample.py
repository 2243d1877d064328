"""Per-sample execution (Megatron's way) on 4 gloo processes equals one process; its cost profile."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from optimizer.costs.tables import CostTables  # noqa: E402
from optimizer.plan.evaluate import build_plan  # noqa: E402
from optimizer.plan.records import Assignment, SolverStats  # noqa: E402
from optimizer.problem.documents import problem_from_json, profile_from_json  # noqa: E402
from trainer.launch import spawn  # noqa: E402
from trainer.per_sample_costs import per_sample_profile  # noqa: E402
from trainer.step_equivalence import reference, step_worker  # noqa: E402
from trainer.tiny_model import TinyConfig  # noqa: E402

LENGTHS = [41, 7, 18, 3, 25, 12, 30, 9]
# Groups of 1, 2 and 3 holding several samples each, and an idle rank in the second micro-batch.
GROUPS = [
    [((0, 1), (0, 1, 2)), ((2,), (3, 4)), ((3,), (5,))],
    [((1, 2, 3), (6, 7))],
]
PACKED = {
    "time": {
        "quadratic": 2e-9,
        "linear": 3e-6,
        "sample_constant": 2e-4,
        "group_constant": 4e-3,
        "sample_step": 1e-4,
        "step_constant": 2e-3,
    },
    "comm": {
        "scheme": "ring",
        "bytes_per_token": 1500,
        "bandwidth_bytes_per_s": {"intra": 2e8, "inter": 2e8},
        "latency_s": {"intra": 1e-3, "inter": 1e-3},
        "group_messages": {"per_step": 6, "fixed": 2},
        "padded_bytes": True,
    },
    "capacity_tokens_per_rank": 1024,
}


def plan_doc(scheme: str, cfg: TinyConfig) -> dict:
    batch = {"samples": [{"id": f"s{i}", "text_tokens": n} for i, n in enumerate(LENGTHS)]}
    profile = {**PACKED, "comm": {**PACKED["comm"], "scheme": scheme}}
    problem = problem_from_json(
        {"batch": batch, "cluster": {"nodes": 1, "gpus_per_node": 4}, "model": cfg.model_document(), "profile": profile}
    )
    tables = CostTables.build(problem)
    return build_plan(tables, Assignment.of(GROUPS), SolverStats("hand", "given", 0.0), 0.0).to_json()


@pytest.mark.parametrize("scheme", ["ring", "ulysses"])
def test_per_sample_step_on_four_processes_equals_one_process(scheme):
    cfg = TinyConfig()
    rng = random.Random(3)
    samples = {f"s{i}": [rng.randrange(cfg.vocab) for _ in range(n)] for i, n in enumerate(LENGTHS)}
    results = spawn(step_worker, 4, plan_doc(scheme, cfg), cfg, samples, 0, "float64", 1, 0, "per-sample")
    ref_loss, ref_grad = reference(cfg, samples)
    for r, res in enumerate(results):
        assert res["loss"] == pytest.approx(ref_loss, rel=1e-12), f"rank {r}"
        err = float((res["grad"] - ref_grad).abs().max())
        assert err <= 1e-12 * max(1.0, float(ref_grad.abs().max())), f"rank {r}: gradient differs by {err}"
    # Rank 0 is idle in the second micro-batch: it waits in the barrier while ranks 1-3 train.
    assert results[0]["barrier_seconds"] > 0


def test_train_step_refuses_an_unknown_execution():
    from trainer.apply import apply_plan
    from trainer.step import train_step

    doc = {"scheme": "ring", "micro_batches": [{"groups": [{"ranks": [0], "samples": ["a"], "lengths": [4]}]}]}
    work = apply_plan(doc, 0)
    with pytest.raises(ValueError, match="execution must be one of"):
        train_step(torch.nn.Linear(1, 1), work, None, {"a": torch.zeros(4, dtype=torch.int64)}, execution="bulk")


def test_per_sample_profile_is_each_sample_alone_plus_a_barrier():
    barrier = 3e-4
    doc = per_sample_profile(PACKED, barrier)
    profile_from_json(doc)  # a profile the planner accepts
    assert doc["time"]["sample_constant"] == pytest.approx(2e-4 + 4e-3) and doc["time"]["group_constant"] == barrier
    assert "group_messages" not in doc["comm"] and (
        doc["comm"]["messages_per_step"],
        doc["comm"]["messages_fixed"],
    ) == (6, 2)
    assert doc["time"]["step_constant"] == pytest.approx(2e-3 - barrier)  # no barrier after the last barrier group
    assert PACKED["comm"]["group_messages"] == {"per_step": 6, "fixed": 2}  # the packed profile is left alone
    lengths = [300, 40, 1500]
    batch = {"samples": [{"id": f"s{i}", "text_tokens": n} for i, n in enumerate(lengths)]}

    def tables(profile):
        cluster = {"nodes": 1, "gpus_per_node": 4}
        return CostTables.build(
            problem_from_json({"batch": batch, "cluster": cluster, "model_preset": "llama3-8b", "profile": profile})
        )

    packed, per_sample = tables(PACKED), tables(doc)
    for ranks in ((0,), (0, 1), (0, 1, 2), (0, 1, 2, 3)):
        alone = sum(packed.group_time([i], ranks) for i in range(len(lengths)))  # each its own forward and backward
        assert per_sample.group_time(list(range(len(lengths))), ranks) == pytest.approx(alone + barrier, rel=1e-12)
    with pytest.raises(ValueError, match="barrier"):
        per_sample_profile(PACKED, -1.0)
