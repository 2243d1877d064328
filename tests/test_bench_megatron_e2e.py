"""bench.megatron_e2e: its figures and table from a synthetic record, its defaults and refusals."""

from __future__ import annotations

import pytest

from bench.megatron_e2e import loss_check, parse, profile_degrees, profile_lengths, summarise, table

PACKED = {
    "time": {"quadratic": 1e-8, "linear": 1e-5, "sample_constant": 1e-4, "group_constant": 4e-3},
    "comm": {
        "scheme": "ring",
        "bytes_per_token": 1536,
        "bandwidth_bytes_per_s": {"intra": 2e8, "inter": 2e8},
        "latency_s": {"intra": 1e-3, "inter": 1e-3},
        "group_messages": {"per_step": 6, "fixed": 2},
    },
    "capacity_tokens_per_rank": 1024,
    "source": "synthetic",
}


def step(predicted, measured, loss=4.5, groups=None, samples=None):
    groups = groups or [[[0, 1]], [[0], [1]]]
    samples = samples or [[["a"]], [["b", "c"], ["d"]]]
    # Group times: measured 0.5 s, predicted 0.4 s (20% low), or 0.6 s (20% high) on rank 1's group.
    times = [[0.5] * len(mb) for mb in groups]
    guesses = [[0.4] * len(mb) for mb in groups]
    guesses[-1][-1] = 0.6
    return {
        "predicted_s": predicted,
        "measured_s": measured,
        "loss": loss,
        "groups": groups,
        "sample_groups": samples,
        "group_times_s": times,
        "group_predicted_s": guesses,
        "verification": {"ok": True},
    }


def record():
    timing = {
        "static": {"execution": "packed", "steps": [step(0.8, 1.0), step(0.9, 1.2)]},
        "megatron": {"execution": "per-sample", "steps": [step(0.5, 0.5), step(0.7, 0.7)]},
        "dhp-megatron": {"execution": "per-sample", "steps": [step(0.45, 0.5), step(0.45, 0.5)]},
        "dhp": {"execution": "packed", "steps": [step(0.4, 0.4), step(0.4, 0.4)]},
    }
    settings = {
        "procs": 2,
        "cores": 2,
        "layers": 2,
        "hidden": 128,
        "heads": 8,
        "kv_heads": 2,
        "dtype": "float32",
        "samples": 16,
        "shortest": 32,
        "longest": 2048,
        "seed": 0,
        "capacity_tokens": 1024,
        "steps": 2,
        "warmup": 1,
    }
    from trainer.per_sample_costs import per_sample_profile

    losses = {
        "static": {"steps": [{"loss": 4.5}, {"loss": 4.25}], "max_loss_rel_diff": 1e-16},
        "megatron": {"steps": [{"loss": 4.5 * (1 + 1e-12)}, {"loss": 4.25}], "max_loss_rel_diff": 2e-16},
    }
    check = {"procs": 4, **loss_check(losses, "float64")}
    return {
        "settings": settings,
        "timing": timing,
        "profile_source": "synthetic",
        "barrier_s": 2e-4,
        "sample_profile": per_sample_profile(PACKED, 2e-4),
        "check": check,
    }


def test_figures_give_means_errors_and_speedups():
    fig = summarise(record())
    assert fig["static"]["measured_mean_s"] == pytest.approx(1.1)
    assert fig["static"]["measured_median_s"] == pytest.approx(1.1)
    assert fig["static"]["error_of_means"] == pytest.approx(0.85 / 1.1 - 1)
    assert fig["static"]["mean_abs_step_error"] == pytest.approx((0.2 + 0.25) / 2)
    assert fig["dhp"]["speedup_over_static"] == pytest.approx(1.1 / 0.4)
    assert fig["dhp"]["speedup_over_megatron"] == pytest.approx(0.6 / 0.4)
    assert fig["dhp-megatron"]["predicted_speedup_over_megatron"] == pytest.approx(0.6 / 0.45)
    assert fig["megatron"]["micro_batches_mean"] == 2 and fig["megatron"]["mean_abs_group_error"] == pytest.approx(0.2)


def test_table_shows_every_arm_and_the_loss_check():
    text = table(record())
    for label in ("(a) static", "(b) megatron", "(c) dhp-megatron", "(d) dhp"):
        assert f"| {label} |" in text
    assert "| 1100.0 | 1100.0 | 850.0 | -22.7% | 22.5%, 20.0% |" in text  # static: median, mean, predicted, errors
    assert "2.750x (2.125x)" in text  # dhp over static, measured (predicted)
    assert "sample_constant a0 + b = 4.100 ms" in text and "barrier 0.200 ms" in text
    assert "Largest relative difference between arms at the same step: 1.00e-12 (tolerance 1e-10: equal)" in text


def test_loss_check_flags_arms_that_differ():
    same = {"a": {"steps": [{"loss": 2.0}]}, "b": {"steps": [{"loss": 2.0 * (1 + 1e-12)}]}}
    assert loss_check(same, "float64")["equal"]
    apart = {"a": {"steps": [{"loss": 2.0}]}, "b": {"steps": [{"loss": 2.001}]}}
    check = loss_check(apart, "float64")
    assert not check["equal"] and check["max_rel_diff_between_arms"] == pytest.approx(0.001 / 2.001)


def test_defaults_follow_the_processes_and_refuse_what_megatron_cannot_place():
    args = parse(["--procs", "2"])
    assert args.longest == 2048 and args.arm_list == ["static", "megatron", "dhp-megatron", "dhp"]
    assert parse(["--procs", "8"]).longest == 4096
    assert profile_degrees(2) == [1, 2] and profile_degrees(6) == [1, 2, 3, 4, 6]
    assert profile_lengths(32, 2048)[0] == 64 and profile_lengths(32, 2048)[-1] == 2048
    with pytest.raises(SystemExit):
        parse(["--procs", "2", "--longest", "4096"])  # 4 ranks of 1024 tokens: more than 2 processes have
    with pytest.raises(SystemExit):
        parse(["--procs", "2", "--arms", "static,flexsp"])
