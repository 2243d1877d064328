"""dhp profile: the fit recovers known coefficients, the command writes a profile the planner accepts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from api.cli.main import main  # noqa: E402
from optimizer.problem.documents import problem_from_json, read_json_file  # noqa: E402
from trainer.profiler import FitRefused, Point, _nnls, check_fit, fit, fit_ring_transfers, profile_document  # noqa: E402

A2, A1, A0, B = 3e-9, 2e-6, 4e-4, 1e-3


def model_time(lengths, d):
    return B + sum((A2 * L * L + A1 * L) / d + A0 for L in lengths)


def test_fit_recovers_the_coefficients_of_exact_points():
    points = [
        Point((L,) * n, d, model_time((L,) * n, d)) for L in (128, 512, 2048) for d in (1, 2, 3) for n in (1, 2, 3)
    ]
    f = fit(points)
    assert (f.quadratic, f.linear, f.sample_constant, f.group_constant) == pytest.approx((A2, A1, A0, B), rel=1e-6)
    assert f.r2 == pytest.approx(1.0) and f.max_rel_error < 1e-6


def test_nnls_keeps_coefficients_non_negative():
    x = torch.tensor([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]]).numpy()
    y = torch.tensor([3.0, 2.0, 1.0]).numpy()  # falling line: the slope would be negative
    coef = _nnls(x, y)
    assert (coef >= 0).all() and coef[1] == 0


def test_ring_transfers_are_recovered_from_the_excess_over_compute():
    points = [Point((L,) * n, d, model_time((L,) * n, d)) for L in (128, 512, 2048) for d in (1, 2) for n in (1, 2)]
    compute = fit(points)
    k, m, bw, lat = 6144.0, 6.0, 2e9, 1e-4
    rings = [
        Point((L,) * n, 2, model_time((L,) * n, 2) + n * (k * L * 0.5 / bw + m * lat))
        for L in (128, 512, 2048)
        for n in (1, 2)
    ]
    got_bw, got_lat, report = fit_ring_transfers(compute, rings, k, m)
    assert got_bw == pytest.approx(bw, rel=1e-6) and got_lat == pytest.approx(lat, rel=1e-6)
    assert report["ring_max_rel_error"] < 1e-6


def test_dhp_profile_writes_a_profile_that_dhp_plan_accepts(tmp_path, capsys):
    out = tmp_path / "profile.json"
    rc = main(
        [
            "profile",
            "--lengths",
            "32,64,96",
            "--degrees",
            "1,2",
            "--mixes",
            "1,2",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--threads",
            "1",
            "--device",
            "cpu",
            "--no-comm",
            "--bandwidth",
            "1e9",
            "--hidden",
            "32",
            "--heads",
            "4",
            "--ffn-hidden",
            "64",
            "--short-mix",
            "4",
            "--min-r2=-inf",
            "--max-error=inf",
            "--out",
            str(out),
            "--report",
            str(tmp_path / "report.json"),
        ]
    )
    assert rc == 0
    err = capsys.readouterr().err
    assert "R^2" in err and "largest relative error" in err
    profile = read_json_file(out, "profile")
    problem = problem_from_json(
        {
            "batch": {"samples": [{"id": "a", "text_tokens": 100}]},
            "cluster": {"nodes": 1, "gpus_per_node": 2},
            "model_preset": "llama3-8b",
            "profile": profile,
        }
    )
    assert problem.cost_profile.quadratic + problem.cost_profile.linear > 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["points"]) == 12 + 2  # and 4 samples of 32 tokens on each group size


@pytest.mark.parametrize(
    "argv, field",
    [
        (["--lengths", "a,b"], "--lengths"),
        (["--no-comm"], "--bandwidth"),
        (["--procs", "0"], "--procs"),
    ],
)
def test_dhp_profile_bad_flags_exit_2_naming_the_flag(argv, field, capsys):
    assert main(["profile", *argv]) == 2
    assert field in capsys.readouterr().err


def test_example_runs_the_whole_path(tmp_path):
    cmd = [
        sys.executable,
        "examples/train_tiny.py",
        "--profile",
        "examples/profile.json",
        "--samples",
        "3",
        "--shortest",
        "16",
        "--longest",
        "64",
        "--steps",
        "1",
        "--json",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    figures = json.loads(res.stdout.strip().splitlines()[-1])
    assert figures["measured_step_time_s"] > 0 and figures["loss"] > 0
    assert "predicted" in res.stderr and "measured" in res.stderr


def test_fit_recovers_the_per_sample_ring_step_term():
    c = 7e-5

    def t(lengths, d):
        return model_time(lengths, d) + c * len(lengths) * (d - 1)

    points = [Point((L,) * n, d, t((L,) * n, d)) for L in (32, 128, 512, 2048) for d in (1, 2, 4) for n in (1, 2, 8)]
    f = fit(points)
    assert (f.quadratic, f.linear, f.sample_constant, f.group_constant, f.sample_step) == pytest.approx(
        (A2, A1, A0, B, c), rel=1e-6
    )
    # Without the term, many short samples on wide groups are predicted too short.
    old = fit(points, sample_step=False)
    assert old.max_rel_error > 0.1 and f.max_rel_error < 1e-6


def test_ring_messages_per_group_and_padded_bytes_are_recovered():
    """The trainer's form: 3 (d-1) + 1 messages per layer and micro-batch whatever the sample count,
    the bytes of the sample padded to 2d; the per-sample form cannot say that 16 samples cost what one does."""
    from optimizer.plan.sharding import padded_length

    points = [
        Point((L,) * n, d, model_time((L,) * n, d))
        for L in (20, 128, 512, 2048)
        for d in (1, 2, 3, 4)
        for n in (1, 2, 16)
    ]
    compute = fit(points)
    k, bw, lat, layers = 6144.0, 2e9, 1e-4, 2
    group = (3.0 * layers, float(layers))

    def ring(lengths, d):
        return (
            model_time(lengths, d)
            + sum(k * padded_length(L, d) * (d - 1) / d for L in lengths) / bw
            + (group[0] * (d - 1) + group[1]) * lat
        )

    rings = [Point((L,) * n, d, ring((L,) * n, d)) for L in (20, 37, 512, 2049) for d in (2, 3, 4) for n in (1, 2, 16)]
    got_bw, got_lat, report = fit_ring_transfers(compute, rings, k, group[0], group)
    assert got_bw == pytest.approx(bw, rel=1e-6) and got_lat == pytest.approx(lat, rel=1e-6)
    assert report["ring_max_rel_error"] < 1e-6 and report["ring_r2"] == pytest.approx(1.0)
    _, _, per_sample = fit_ring_transfers(compute, rings, k, group[0])
    assert per_sample["ring_max_rel_error"] > 0.3
    # The profile written for it plans what was measured: the planner's group time equals the ring's.
    doc = profile_document(compute, k, got_bw, got_lat, 65536, group=group, step_constant=0.004)
    problem = problem_from_json(
        {
            "batch": {"samples": [{"id": f"s{i}", "text_tokens": 37} for i in range(16)]},
            "cluster": {"nodes": 1, "gpus_per_node": 4},
            "profile": doc,
        }
    )
    from optimizer.costs.tables import CostTables

    assert CostTables.build(problem).group_time(list(range(16)), (0, 1, 2)) == pytest.approx(
        ring((37,) * 16, 3), rel=1e-6
    )
    assert problem.cost_profile.step_constant == 0.004 and problem.cost_profile.padded_bytes


@pytest.mark.parametrize(
    "report, field",
    [
        ({"r2": 0.99, "max_rel_error": 0.1, "per_token_s": 0.0}, "--lengths"),
        ({"r2": 0.5, "max_rel_error": 0.1}, "--min-r2"),
        ({"r2": -0.4, "max_rel_error": 0.1}, "--min-r2"),
        ({"r2": 0.99, "max_rel_error": 0.9}, "--max-error"),
        ({"r2": 0.99, "max_rel_error": 0.1, "ring_r2": 0.2, "ring_max_rel_error": 0.1}, "--min-r2"),
        (
            {"r2": 0.99, "max_rel_error": 0.1, "comm_measured": True, "bandwidth_bytes_per_s": float("inf")},
            "--bandwidth",
        ),
        ({"r2": 0.99, "max_rel_error": 0.1, "comm_measured": True, "bandwidth_bytes_per_s": 1e12 * 100}, "--bandwidth"),
    ],
)
def test_check_fit_refuses_poor_or_degenerate_fits(report, field):
    with pytest.raises(FitRefused) as exc:
        check_fit(report, 0.9, 0.5)
    assert exc.value.field == field


def test_check_fit_accepts_a_good_fit():
    check_fit(
        {"r2": 0.99, "max_rel_error": 0.1, "comm_measured": True, "bandwidth_bytes_per_s": 2e9, "latency_s": 1e-5},
        0.9,
        0.5,
    )


def test_dhp_profile_refuses_a_noisy_fit_with_exit_2(monkeypatch, capsys):
    import trainer.profiler as profiler

    def noisy(model, cfg, settings, device, progress=None):
        # Times that do not follow the lengths at all: no formula explains them.
        values = [0.9, 0.1, 0.5, 0.05, 0.7, 0.02, 0.3, 0.8]
        return (
            [
                Point((L,) * n, d, values[(i * 5) % 8])
                for i, (L, d, n) in enumerate((L, d, n) for L in (32, 64) for d in (1, 2) for n in (1, 2))
            ],
            [],
            0.0,
        )

    monkeypatch.setattr(profiler, "measure_all", noisy)
    rc = main(
        [
            "profile",
            "--lengths",
            "32,64",
            "--degrees",
            "1,2",
            "--mixes",
            "1,2",
            "--device",
            "cpu",
            "--no-comm",
            "--bandwidth",
            "1e9",
            "--hidden",
            "32",
            "--heads",
            "4",
            "--ffn-hidden",
            "64",
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "refused the measured profile" in err and "R^2" in err and "--min-r2" in err


@pytest.mark.parametrize("procs", [2, 4])
def test_cost_check_batches_are_valid_plans(procs):
    from trainer.cost_check import cases, predicted_plan
    from trainer.tiny_model import TinyConfig

    profile = {
        "time": {"quadratic": 1e-9, "linear": 1e-6, "sample_constant": 1e-4, "group_constant": 1e-3},
        "comm": {"scheme": "ring", "bytes_per_token": 1000, "bandwidth_bytes_per_s": {"intra": 1e9, "inter": 1e9}},
        "capacity_tokens_per_rank": 65536,
    }
    for name, lengths, groups in cases(procs):
        used = sorted(i for mb in groups for _, idx in mb for i in idx)
        assert used == list(range(len(lengths))), name
        for mb in groups:
            ranks = [r for rs, _ in mb for r in rs]
            assert len(ranks) == len(set(ranks)) and max(ranks) < procs, name
        doc = predicted_plan(profile, TinyConfig(hidden=64, heads=4, ffn_hidden=256), lengths, groups, procs)
        assert doc["predicted_step_time_s"] > 0
    with pytest.raises(ValueError):
        cases(3)


def test_dhp_profile_times_the_hf_llama_that_train_hf_trains(tmp_path, capsys):
    pytest.importorskip("transformers")
    from trainer.profiler import ProfileSettings, build_model, comm_terms
    from trainer.tiny_model import TinyConfig

    out = tmp_path / "profile.json"
    rc = main(
        [
            "profile",
            "--arch",
            "llama",
            "--kv-heads",
            "2",
            "--lengths",
            "32,64,96",
            "--degrees",
            "1,2",
            "--mixes",
            "1,2",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--threads",
            "1",
            "--device",
            "cpu",
            "--no-comm",
            "--bandwidth",
            "1e9",
            "--hidden",
            "32",
            "--heads",
            "4",
            "--ffn-hidden",
            "64",
            "--short-mix",
            "0",
            "--min-r2=-inf",
            "--max-error=inf",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    assert "llama model" in capsys.readouterr().err
    profile = read_json_file(out, "profile")
    assert "llama model 2x32 (4/2 heads, MLP 64)" in profile["source"]
    cfg = TinyConfig(hidden=32, heads=4, ffn_hidden=64)
    # Keys and values of 2 of 4 heads: half the bytes per token of full attention.
    assert profile["comm"]["bytes_per_token"] == pytest.approx(comm_terms(cfg, torch.float32)[0] / 2)
    model = build_model(cfg, ProfileSettings(architecture="llama", kv_heads=2, device="cpu"), torch.device("cpu"))
    assert model.model.config.num_key_value_heads == 2 and model.model.config.intermediate_size == 64
    with pytest.raises(ValueError, match="kv_heads"):
        ProfileSettings(kv_heads=2)  # key/value heads belong to the llama architecture
