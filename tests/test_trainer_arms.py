"""The four plan sources of the end-to-end comparison give valid plans for a small batch (one process, no torchrun)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from optimizer.errors import ProblemError  # noqa: E402
from optimizer.problem.documents import problem_from_json  # noqa: E402
from optimizer.verify.verifier import check_assignment  # noqa: E402
from trainer.apply import apply_plan  # noqa: E402
from trainer.arms import ARMS, ArmPlanner, megatron_plan  # noqa: E402
from trainer.megatron import MEGATRON_RULES, assignment_of  # noqa: E402
from trainer.per_sample_costs import per_sample_profile  # noqa: E402
from trainer.train_hf import batch_lengths, make_request, packed_profile, parse  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROFILE = {
    "time": {
        "quadratic": 9e-8,
        "linear": 4e-5,
        "sample_constant": 1.5e-4,
        "group_constant": 4.5e-3,
        "sample_step": 1.2e-3,
        "step_constant": 2e-3,
    },
    "comm": {
        "scheme": "ring",
        "bytes_per_token": 1536,
        "bandwidth_bytes_per_s": {"intra": 2e8, "inter": 2e8},
        "latency_s": {"intra": 1e-3, "inter": 1e-3},
        "group_messages": {"per_step": 6, "fixed": 2},
        "padded_bytes": True,
    },
    "capacity_tokens_per_rank": 256,
}


MODEL = {
    "name": "hf-tiny",
    "llm": {
        "layers": 2,
        "hidden": 48,
        "heads": 6,
        "kv_heads": 2,
        "ffn_hidden": 96,
        "vocab": 96,
        "parameters": 1e5,
        "gated_mlp": True,
    },
}
"""The small Llama's model document the requests carry."""


def per_rank(doc, n=4):
    """A plan as Megatron's sample_id_groups: per micro-batch, per rank, the samples of its group."""
    return [
        [[sid for g in mb["groups"] if r in g["ranks"] for sid in g["samples"]] for r in range(n)]
        for mb in doc["micro_batches"]
    ]


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    path = tmp_path_factory.mktemp("arms") / "profile.json"
    path.write_text(json.dumps(PROFILE))
    args = parse(
        [
            "--profile",
            str(path),
            "--capacity-tokens",
            "256",
            "--samples",
            "10",
            "--shortest",
            "16",
            "--longest",
            "1024",
            "--budget-ms",
            "100",
        ]
    )
    lengths = batch_lengths(0, args.samples, args.seed, args.shortest, args.longest)
    return args, make_request(lengths, args, MODEL, 4), per_sample_profile(packed_profile(args), 2e-4)


@pytest.mark.parametrize("arm", list(ARMS))
def test_each_arm_gives_a_valid_plan_of_the_batch(setting, arm):
    args, request, sample_profile = setting
    doc = ArmPlanner(arm, sample_profile).plan(request)
    assert doc["arm"] == arm and doc["execution"] == ARMS[arm]
    ids = [s["id"] for s in request["batch"]["samples"]]
    planned = [sid for mb in doc["micro_batches"] for g in mb["groups"] for sid in g["samples"]]
    assert sorted(planned) == sorted(ids)  # every sample once
    # The plan is what its execution's profile and rules allow, and its time is that profile's.
    per_sample = ARMS[arm] == "per-sample"
    rules = MEGATRON_RULES if per_sample else request["options"]
    profile = sample_profile if per_sample else request["profile"]
    problem = problem_from_json({**request, "profile": profile, "options": rules})
    report = check_assignment(problem, assignment_of(per_rank(doc), problem.batch.index))
    assert doc["predicted_step_time_s"] == pytest.approx(report.step_time_s, rel=1e-9)
    if arm != "megatron":  # Megatron's greedy may start a group off the aligned blocks; its verification says so
        assert report.ok, report.violations
    assert doc.get("verification", {"ok": True})["ok"] == report.ok
    # Samples above 256 tokens need a group.
    assert any(len(g["ranks"]) > 1 for mb in doc["micro_batches"] for g in mb["groups"])
    works = [apply_plan(doc, r) for r in range(4)]
    assert all(w.total_labels == sum(n - 1 for n in batch_lengths(0, 10, 0, 16, 1024).values()) for w in works)


def test_the_megatron_arm_is_megatrons_own_schedule(setting):
    from megatron.core.pipeline_parallel.hybrid_cp_schedule import BalancedCPScheduler

    from trainer.megatron import DomainGroup

    _, request, sample_profile = setting
    doc = megatron_plan(request, sample_profile)
    seqlens = [(s["id"], s["text_tokens"]) for s in request["batch"]["samples"]]
    _, own = BalancedCPScheduler(256, DomainGroup(4)).get_groups_and_subsamples(seqlens, None)
    ours = per_rank(doc)
    assert [[sorted(ids) for ids in ranks] for ranks in own] == [[sorted(ids) for ids in ranks] for ranks in ours]


def test_the_megatron_arm_refuses_what_its_scheduler_cannot_place(setting):
    _, request, sample_profile = setting
    long = {**request, "batch": {"samples": [*request["batch"]["samples"], {"id": "huge", "text_tokens": 1100}]}}
    with pytest.raises(ProblemError, match="needs 8 ranks"):
        megatron_plan(long, sample_profile)
    few = {**request, "batch": {"samples": request["batch"]["samples"][:3]}}
    with pytest.raises(ProblemError, match="a sample for every rank"):
        megatron_plan(few, sample_profile)
    with pytest.raises(ProblemError, match="per-sample profile"):
        ArmPlanner("dhp-megatron")


def test_torchrun_trains_a_per_sample_arm_like_one_process(tmp_path):
    from api.local_server import free_port

    out = tmp_path / "run.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
        "-m",
        "trainer.train_hf",
        "--arm",
        "megatron",
        "--steps",
        "2",
        "--dtype",
        "float64",
        "--reference",
        "--out",
        str(out),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    run = json.loads(out.read_text())
    assert run["arm"] == "megatron" and run["execution"] == "per-sample" and run["barrier_s"] > 0
    assert run["sample_profile"]["time"]["group_constant"] == run["barrier_s"]
    assert run["max_loss_rel_diff"] < 1e-12 and run["max_parameter_diff"] < 1e-12
    assert all(s["predicted_s"] > 0 and s["measured_s"] > 0 for s in run["steps"])


def test_the_trainer_plans_with_the_analytical_model_or_a_learned_profile():
    model = MODEL
    lengths = batch_lengths(0, 4, 0, 8, 64)
    analytical = make_request(lengths, parse(["--profile", "analytical"]), model, 4)
    assert "profile" not in analytical and analytical["options"]["cp_scheme"] == "ring"
    assert problem_from_json(analytical).profile is None
    learned = make_request(lengths, parse(["--profile", "learned:k.v1", "--service", "http://x"]), model, 4)
    assert learned["profile"] == "learned:k.v1"
    for argv in (["--profile", "learned:k.v1"], ["--profile", "analytical", "--arm", "static"]):
        with pytest.raises(SystemExit):
            parse(argv)
