"""End-to-end: a planned step on 6 gloo processes (2 nodes x 3) equals one process on the whole batch."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from optimizer.costs.tables import CostTables  # noqa: E402
from optimizer.plan.evaluate import build_plan  # noqa: E402
from optimizer.plan.records import Assignment, SolverStats  # noqa: E402
from optimizer.problem.documents import problem_from_json  # noqa: E402
from optimizer.verify.verifier import verify  # noqa: E402
from trainer.launch import spawn  # noqa: E402
from trainer.step_equivalence import reference, step_worker  # noqa: E402
from trainer.tiny_model import TinyConfig  # noqa: E402

LENGTHS = [37, 20, 9, 5, 11, 16, 29, 13, 3]
TINY_PROFILE = {
    "time": {"quadratic": 1e-9, "linear": 1e-6, "sample_constant": 1e-4, "group_constant": 1e-3},
    "comm": {"scheme": "ring", "bytes_per_token": 1000, "bandwidth_bytes_per_s": {"intra": 1e9, "inter": 1e8}},
    "capacity_tokens_per_rank": 4096,
}
# Sizes 3, 2 and 1 in every micro-batch, one group across the two nodes (ranks 2 and 3), idle ranks in the last.
GROUPS = [
    [((0, 1, 2), (0,)), ((3, 4), (1, 2)), ((5,), (3,))],
    [((0,), (4,)), ((1, 2), (5,)), ((3, 4, 5), (6,))],
    [((2, 3), (7,)), ((5,), (8,))],
]


def make_plan(scheme: str, cfg: TinyConfig):
    batch = {"samples": [{"id": f"s{i}", "text_tokens": n} for i, n in enumerate(LENGTHS)]}
    profile = {**TINY_PROFILE, "comm": {**TINY_PROFILE["comm"], "scheme": scheme}}
    problem = problem_from_json(
        {"batch": batch, "cluster": {"nodes": 2, "gpus_per_node": 3}, "model": cfg.model_document(), "profile": profile}
    )
    tables = CostTables.build(problem)
    assignment = Assignment.of(GROUPS)
    plan = build_plan(tables, assignment, SolverStats("hand", "given", 0.0), 0.0)
    report = verify(plan, problem)
    assert report.ok, report.violations
    return plan


@pytest.mark.parametrize("scheme", ["ring", "ulysses"])
def test_six_process_step_equals_single_process(scheme):
    cfg = TinyConfig()
    plan = make_plan(scheme, cfg)
    assert sorted({len(g.ranks) for mb in plan.micro_batches for g in mb.groups}) == [1, 2, 3]
    rng = random.Random(7)
    samples = {f"s{i}": [rng.randrange(cfg.vocab) for _ in range(n)] for i, n in enumerate(LENGTHS)}
    results = spawn(step_worker, 6, plan.to_json(), cfg, samples)
    ref_loss, ref_grad = reference(cfg, samples)
    for r, res in enumerate(results):
        assert res["loss"] == pytest.approx(ref_loss, rel=1e-10), f"rank {r}"
        err = float((res["grad"] - ref_grad).abs().max())
        assert err <= 1e-10 * max(1.0, float(ref_grad.abs().max())), f"rank {r}: gradient differs by {err}"
    # The check can fail: a step that skipped a sample would change the loss.
    partial = {k: v for k, v in samples.items() if k != "s8"}
    assert reference(cfg, partial)[0] != pytest.approx(ref_loss, rel=1e-6)
