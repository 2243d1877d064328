"""The profile zoo: every profile loads, parses and plans a small batch validly; the loader's errors."""

from __future__ import annotations

import json

import pytest

from api.cli.main import main
from bench.planners import plan_assignment
from optimizer.costs.analytical import analytical_profile
from optimizer.costs.zoo import describe_presets, load_profile, profile_names
from optimizer.errors import ProblemError
from optimizer.presets import load_preset, preset_names
from optimizer.problem.documents import cluster_from_json, model_from_json, problem_from_json, profile_from_json
from optimizer.problem.workloads import image_sft
from optimizer.verify.verifier import check_assignment
from planning.planner import plan

TEXT_MODEL = {
    "name": "gpt-7b-64h",
    "llm": {
        "layers": 32,
        "hidden": 4096,
        "heads": 64,
        "kv_heads": 64,
        "ffn_hidden": 11008,
        "vocab": 32000,
        "parameters": 7.0e9,
    },
    "training": {"zero_stage": 3, "recompute": "full"},
}
"""Heads divisible by every power of two up to 64, so a Ulysses profile may use any of those group sizes."""

STRESS = (
    "stress-group-constant",
    "stress-slow-inter",
    "stress-comm-dominant",
    "stress-quadratic",
    "stress-memory-tight",
    "stress-mixed-gpu",
)


def test_the_zoo_holds_what_it_promises():
    names = profile_names()
    for n in ("flexsp-gpt7b", "flexsp-gpt13b", "flexsp-gpt30b", *STRESS):
        assert n in names
    pairs = [f"analytical-{m}-{c}" for m in preset_names("models") for c in preset_names("clusters")]
    assert set(pairs) <= set(names)
    assert len(names) == len(set(names)) == 9 + len(pairs)
    for n in STRESS:
        doc = load_profile(n)
        assert doc["source"].startswith("stress: ")
    assert describe_presets()["profiles"].keys() == set(names)


def test_flexsp_profiles_keep_their_fitted_numbers():
    seven = load_profile("flexsp-gpt7b")
    assert seven["time"]["quadratic"] == pytest.approx(5.128e-9) and seven["time"]["group_constant"] == pytest.approx(
        0.6293563
    )
    assert seven["capacity_tokens_per_rank"] == 6449 and seven["comm"]["scheme"] == "ulysses"
    assert load_profile("flexsp-gpt30b")["time"]["linear"] == pytest.approx(803.5742e-6)


def test_analytical_entries_equal_the_engine_analytical_profile():
    for m in preset_names("models"):
        for c in preset_names("clusters"):
            expected = analytical_profile(
                model_from_json(load_preset("models", m, "m")), cluster_from_json(load_preset("clusters", c, "c"))
            ).to_json()
            assert load_profile(f"analytical-{m}-{c}") == expected


def _problem_for(name: str, batch: dict) -> dict:
    doc = load_profile(name)
    if name.startswith("analytical-"):
        model, cluster = next(
            (m, c) for m in preset_names("models") for c in preset_names("clusters") if name == f"analytical-{m}-{c}"
        )
        return {"batch": batch, "cluster_preset": cluster, "model_preset": model, "profile": doc}
    cluster: dict = {"nodes": 2, "gpus_per_node": 8}
    if name == "stress-mixed-gpu":
        return {"batch": batch, "cluster_preset": "mixed-h100-a100", "model": TEXT_MODEL, "profile": doc}
    return {"batch": batch, "cluster": cluster, "model": TEXT_MODEL, "profile": doc}


@pytest.mark.parametrize("name", profile_names())
def test_every_zoo_profile_plans_a_small_batch_validly(name):
    doc = _problem_for(name, image_sft(48, seed=1))
    profile = profile_from_json(doc["profile"])
    assert profile_from_json(profile.to_json()) == profile  # the file is in the documented form, nothing lost
    problem = problem_from_json({**doc, "options": {"backend": "heuristic", "time_budget_ms": 500}})
    result = plan(problem)
    report = check_assignment(problem, plan_assignment(result, problem))
    assert report.ok, report.violations[:3]
    assert report.step_time_s == pytest.approx(result.predicted_step_time_s, rel=1e-9)
    assert result.lower_bound_s <= result.predicted_step_time_s * (1 + 1e-9)


def test_mixed_gpu_profile_slows_groups_on_a100_nodes():
    problem = problem_from_json(_problem_for("stress-mixed-gpu", image_sft(8, seed=0)))
    from optimizer.costs.tables import CostTables

    t = CostTables.build(problem)
    h100, a100 = (0, 1), (16, 17)  # the preset lists 2 H100 nodes, then 2 A100 nodes
    assert t.group_span(a100)[1] == pytest.approx(0.32) and t.group_span(h100)[1] == 1.0
    assert t.group_time([0, 1], a100) > t.group_time([0, 1], h100)


def test_unknown_profile_preset_names_the_field(capsys, tmp_path):
    with pytest.raises(ProblemError) as exc:
        load_profile("flexsp-gpt70b")
    assert exc.value.field == "profile_preset" and "flexsp-gpt7b" in str(exc.value.hint)
    batch = tmp_path / "b.json"
    batch.write_text(json.dumps(image_sft(4, seed=0)))
    assert main(["plan", "--batch", str(batch), "--nodes", "1", "--profile-preset", "nope", "--summary"]) == 2
    assert "--profile-preset" in capsys.readouterr().err


def test_cli_profile_preset_and_presets_listing(capsys, tmp_path):
    batch = tmp_path / "b.json"
    batch.write_text(json.dumps(image_sft(16, seed=0)))
    model = tmp_path / "m.json"
    model.write_text(json.dumps(TEXT_MODEL))
    assert (
        main(
            [
                "plan",
                "--batch",
                str(batch),
                "--nodes",
                "1",
                "--model",
                str(model),
                "--profile-preset",
                "flexsp-gpt7b",
                "--show-profile",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out) == profile_from_json(load_profile("flexsp-gpt7b")).to_json()
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    assert "profiles: " in out and "stress-slow-inter" in out and "analytical-qwen2-vl-7b-h100-8x8" in out
