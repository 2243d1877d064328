"""dhp profile for the user's model (trainer.model_profile): dimensions from a Hugging Face config, a preset or a
model document; the grid cut to the time budget; two depths extrapolated; inter-node terms from the cluster."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from api.cli.main import main  # noqa: E402
from optimizer.errors import ProblemError  # noqa: E402
from optimizer.problem.documents import problem_from_json, read_json_file  # noqa: E402
from trainer.model_profile import (  # noqa: E402
    extrapolate,
    fit_budget,
    from_hf_config,
    from_model_preset,
    inter_node_terms,
    model_dims,
    unseparated,
)
from trainer.profiler import ProfileSettings  # noqa: E402


def small_config(tmp_path, model_type="qwen2", **extra):
    doc = {
        "model_type": model_type,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 6,
        "vocab_size": 96,
        "max_position_embeddings": 512,
        **extra,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    return path


def test_dimensions_come_from_the_config_the_preset_or_the_document(tmp_path):
    dims = from_hf_config(str(small_config(tmp_path).parent))  # the directory holding config.json
    assert (dims.architecture, dims.layers, dims.kv_heads, dims.config.hidden) == ("qwen2", 6, 2, 32)
    assert from_hf_config("examples/hf-configs/tinyllama-1.1b.json").architecture == "llama"
    preset = from_model_preset("llama3-8b")
    assert preset.layers == 32 and preset.config.hidden == 4096 and preset.kv_heads == 8
    with pytest.raises(ProblemError, match="model_type 'gpt2'") as bad:
        from_hf_config(str(small_config(tmp_path, model_type="gpt2")))
    assert bad.value.field == "--hf-config"
    with pytest.raises(ProblemError, match="sliding-window"):
        from_hf_config(str(small_config(tmp_path, use_sliding_window=True)))
    with pytest.raises(ProblemError, match="one of"):
        model_dims("llama3-8b", None, "x.json")


def test_the_grid_is_cut_to_the_budget_longest_lengths_first():
    dims = from_model_preset("llama3-8b")
    settings = ProfileSettings(lengths=(256, 512, 1024, 2048, 4096), degrees=(1, 2, 4), mixes=(1, 2, 3))
    cut, est, what = fit_budget(settings, dims, probe_s=0.05, probe_work=1e11, budget_s=60.0)
    assert est <= 60.0 and what and what[0] == "length 4096"
    assert cut.lengths == settings.lengths[: len(cut.lengths)]
    same, _, nothing = fit_budget(settings, dims, probe_s=1e-6, probe_work=1e12, budget_s=60.0)
    assert same == settings and nothing == []
    with pytest.raises(ProblemError, match="smallest grid") as over:
        fit_budget(settings, dims, probe_s=10.0, probe_work=1.0, budget_s=60.0)
    assert over.value.field == "--budget-s" and "raise --budget-s to" in over.value.hint


def test_two_depths_extrapolate_linearly_and_inter_terms_follow_the_cluster():
    one = {"time": {"quadratic": 1e-9, "linear": 3e-6, "group_constant": 2e-3}}
    two = {"time": {"quadratic": 2e-9, "linear": 4e-6, "group_constant": 1e-3}}
    # group_constant: the 2-block fit is below the 1-block one (noise), so it is scaled, not drawn through zero
    assert extrapolate(one, two, 10) == pytest.approx({"quadratic": 1e-8, "linear": 1.2e-5, "group_constant": 5e-3})
    assert unseparated(one, two) == ["group_constant"]
    noisy = {"time": {"quadratic": 0.5e-9, "linear": 2e-6, "group_constant": 1e-3}}  # a busy machine's 2 blocks
    far = extrapolate(one, noisy, 32)
    assert far == pytest.approx({"quadratic": 8e-9, "linear": 3.2e-5, "group_constant": 1.6e-2})
    assert all(v > 0 for v in far.values())
    assert unseparated({"time": {"step_constant": 0.0}}, {"time": {"step_constant": 0.0}}) == []  # nothing to scale
    profile = {
        "comm": {"bandwidth_bytes_per_s": {"intra": 1e9, "inter": 1e9}, "latency_s": {"intra": 1e-5, "inter": 1e-5}}
    }
    said = inter_node_terms(profile, None)
    assert "not measured" in said and profile["comm"]["bandwidth_bytes_per_s"]["inter"] == 1e9
    from optimizer.presets import load_preset
    from optimizer.problem.documents import cluster_from_json

    cluster = cluster_from_json(load_preset("clusters", "h100-8x8", "c"))
    said = inter_node_terms(profile, ("cluster preset h100-8x8", cluster))
    assert profile["comm"]["bandwidth_bytes_per_s"]["inter"] == cluster.inter_bandwidth
    assert profile["comm"]["latency_s"]["inter"] == cluster.inter_latency and "h100-8x8" in said
    assert "inter-node terms from the cluster preset h100-8x8" in profile["source"]


def test_dhp_profile_hf_config_writes_a_profile_of_the_whole_depth(tmp_path, capsys):
    config = small_config(tmp_path)
    out, report_path = tmp_path / "profile.json", tmp_path / "report.json"
    argv = ["profile", "--hf-config", str(config), "--budget-s", "120", "--lengths", "32,64,128,192"]
    argv += ["--degrees", "1,2", "--mixes", "1,2", "--repeats", "1", "--warmup", "1", "--threads", "1"]
    argv += ["--device", "cpu", "--no-comm", "--bandwidth", "1e9", "--cluster-preset", "h100-8x8", "--short-mix", "4"]
    argv += ["--min-r2=-inf", "--max-error=inf", "--out", str(out), "--report", str(report_path)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "estimated" in err and "budget 120 s" in err and "extrapolated to 6 blocks" in err
    assert "fit at 1 block(s)" in err and "fit at 2 block(s)" in err and "held-out points" in err
    profile = read_json_file(out, "profile")
    report = json.loads(report_path.read_text())
    assert report["model"]["layers"] == 6 and set(report["depths"]) == {"1", "2"}
    assert report["depths"]["2"]["held_out_mean_error"] is not None
    assert isinstance(report["scaled_from_the_deeper_fit"], list)
    assert profile["comm"]["group_messages"] == {"per_step": 18.0, "fixed": 6.0}  # 3 x 6 layers, 6 layers
    assert profile["comm"]["bandwidth_bytes_per_s"]["inter"] == 5e10  # h100-8x8's inter-node bandwidth
    problem = problem_from_json(
        {
            "batch": {"samples": [{"id": "a", "text_tokens": 100}]},
            "cluster": {"nodes": 1, "gpus_per_node": 2},
            "model_preset": "llama3-8b",
            "profile": profile,
        }
    )
    assert problem.cost_profile.linear + problem.cost_profile.quadratic > 0


def test_a_profile_whose_fits_put_no_time_on_the_tokens_is_refused_with_the_flags_to_change(
    tmp_path, capsys, monkeypatch
):
    import trainer.model_profile as model_profile

    flat = {"time": {"quadratic": 0.0, "linear": 0.0, "group_constant": 1e-3}, "comm": {}}
    monkeypatch.setattr(model_profile, "measure_profile", lambda *a, **k: (flat, {}))
    out = tmp_path / "profile.json"
    argv = ["profile", "--hf-config", str(small_config(tmp_path)), "--budget-s", "120", "--lengths", "32,64"]
    argv += ["--degrees", "1", "--mixes", "1", "--repeats", "1", "--device", "cpu", "--no-comm", "--bandwidth", "1e9"]
    argv += ["--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no time on the tokens" in err and "--repeats" in err and "Traceback" not in err
    assert not out.exists()
