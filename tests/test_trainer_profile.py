"""dhp profile: the fit recovers known coefficients, the command writes a profile the planner accepts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from api.commands import main  # noqa: E402
from optimizer.problem.documents import problem_from_json, read_json_file  # noqa: E402
from trainer.profiler import Point, _nnls, fit, fit_ring_transfers  # noqa: E402

A2, A1, A0, B = 3e-9, 2e-6, 4e-4, 1e-3


def model_time(lengths, d):
    return B + sum((A2 * L * L + A1 * L) / d + A0 for L in lengths)


def test_fit_recovers_the_coefficients_of_exact_points():
    points = [Point((L,) * n, d, model_time((L,) * n, d)) for L in (128, 512, 2048) for d in (1, 2, 3) for n in (1, 2, 3)]
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
    rings = [Point((L,) * n, 2, model_time((L,) * n, 2) + n * (k * L * 0.5 / bw + m * lat)) for L in (128, 512, 2048) for n in (1, 2)]
    got_bw, got_lat, report = fit_ring_transfers(compute, rings, k, m)
    assert got_bw == pytest.approx(bw, rel=1e-6) and got_lat == pytest.approx(lat, rel=1e-6)
    assert report["ring_max_rel_error"] < 1e-6


def test_dhp_profile_writes_a_profile_that_dhp_plan_accepts(tmp_path, capsys):
    out = tmp_path / "profile.json"
    rc = main(["profile", "--lengths", "32,64,96", "--degrees", "1,2", "--mixes", "1,2", "--repeats", "1", "--warmup", "0",
               "--threads", "1", "--device", "cpu", "--no-comm", "--bandwidth", "1e9", "--hidden", "32", "--heads", "4",
               "--ffn-hidden", "64", "--out", str(out), "--report", str(tmp_path / "report.json")])
    assert rc == 0
    err = capsys.readouterr().err
    assert "R^2" in err and "largest relative error" in err
    profile = read_json_file(out, "profile")
    problem = problem_from_json({"batch": {"samples": [{"id": "a", "text_tokens": 100}]}, "cluster": {"nodes": 1, "gpus_per_node": 2},
                                 "model_preset": "llama3-8b", "profile": profile})
    assert problem.cost_profile.quadratic + problem.cost_profile.linear > 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["points"]) == 12


@pytest.mark.parametrize("argv, field", [
    (["--lengths", "a,b"], "--lengths"),
    (["--no-comm"], "--bandwidth"),
    (["--procs", "0"], "--procs"),
])
def test_dhp_profile_bad_flags_exit_2_naming_the_flag(argv, field, capsys):
    assert main(["profile", *argv]) == 2
    assert field in capsys.readouterr().err


def test_example_runs_the_whole_path(tmp_path):
    cmd = [sys.executable, "examples/train_tiny.py", "--profile", "examples/profile.json", "--samples", "3", "--shortest", "16",
           "--longest", "64", "--steps", "1", "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    figures = json.loads(res.stdout.strip().splitlines()[-1])
    assert figures["measured_step_time_s"] > 0 and figures["loss"] > 0
    assert "predicted" in res.stderr and "measured" in res.stderr
