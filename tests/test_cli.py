"""The dhp command line: JSON output, summary, validation, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from api.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_prints_the_plan_json(capsys, tmp_path):
    code, out, _ = run(
        capsys,
        "plan",
        "--batch",
        str(EXAMPLES / "batch_small.json"),
        "--cluster-preset",
        "h100-8x8",
        "--model-preset",
        "qwen2-vl-7b",
        "--backend",
        "heuristic",
    )
    assert code == 0
    doc = json.loads(out)
    assert {
        "micro_batches",
        "predicted_step_time_s",
        "lower_bound_s",
        "solver",
        "communicators",
        "static_baseline",
    } <= set(doc)
    assert {"backend", "status", "wall_ms"} <= set(doc["solver"])
    group = doc["micro_batches"][0]["groups"][0]
    assert group["ranks"] and group["samples"] and group["shards"][0]["ranges"]
    # The printed plan validates against the same inputs.
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(out)
    code, out, _ = run(
        capsys,
        "validate",
        "--plan",
        str(plan_file),
        "--batch",
        str(EXAMPLES / "batch_small.json"),
        "--cluster-preset",
        "h100-8x8",
        "--model-preset",
        "qwen2-vl-7b",
    )
    assert code == 0 and out.startswith("valid")
    # A tampered plan does not.
    doc["micro_batches"][0]["groups"][0]["samples"] = []
    plan_file.write_text(json.dumps(doc))
    code, out, _ = run(
        capsys,
        "validate",
        "--plan",
        str(plan_file),
        "--batch",
        str(EXAMPLES / "batch_small.json"),
        "--cluster-preset",
        "h100-8x8",
        "--model-preset",
        "qwen2-vl-7b",
    )
    assert code == 1 and "not planned" in out


def test_summary_and_shorthand_cluster(capsys):
    code, out, _ = run(
        capsys,
        "plan",
        "--batch",
        str(EXAMPLES / "batch_image_64.json"),
        "--nodes",
        "2",
        "--gpus-per-node",
        "8",
        "--model-preset",
        "internvl2-8b",
        "--summary",
        "--backend",
        "heuristic",
    )
    assert code == 0
    assert "predicted step" in out and "lower bound" in out and "micro-batch 0" in out


def test_profile_file_is_used_as_given(capsys):
    code, out, _ = run(
        capsys,
        "plan",
        "--batch",
        str(EXAMPLES / "batch_small.json"),
        "--cluster-preset",
        "h100-8x8",
        "--profile",
        str(EXAMPLES / "profile.json"),
        "--show-profile",
    )
    assert code == 0
    given = json.loads((EXAMPLES / "profile.json").read_text())
    shown = json.loads(out)
    assert shown["time"] == given["time"] and shown["capacity_tokens_per_rank"] == given["capacity_tokens_per_rank"]
    assert shown["comm"]["bandwidth_bytes_per_s"]["intra"] == given["comm"]["bandwidth_bytes_per_s"]["intra"]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('{"samples": [{"id": "a", "text_tokens": "many"}]}', "batch.samples[0].text_tokens"),
        ('{"samples": [', "not valid JSON"),
        (None, "cannot read"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, content, needle):
    batch = tmp_path / "batch.json"
    if content is not None:
        batch.write_text(content)
    proc = subprocess.run(
        [sys.executable, "-m", "api.cli.main", "plan", "--batch", str(batch)], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in proc.stderr


def test_infeasible_exit_3(tmp_path, capsys):
    batch = tmp_path / "batch.json"
    batch.write_text(json.dumps({"samples": [{"id": "long", "text_tokens": 5_000_000}]}))
    code, _, err = run(capsys, "plan", "--batch", str(batch), "--nodes", "1", "--model-preset", "qwen2-vl-7b")
    assert code == 3 and "long" in err and "To fix" in err


def _one_line(proc, code, needle):
    err = proc.stderr.decode(errors="replace") if isinstance(proc.stderr, bytes) else proc.stderr
    assert proc.returncode == code, (proc.returncode, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err, err


def _dhp(*argv, **kwargs):
    return subprocess.run([sys.executable, "-m", "api.cli.main", *argv], capture_output=True, cwd=ROOT, **kwargs)


OK_BATCH = str(EXAMPLES / "batch_small.json")
PRESETS = ("--cluster-preset", "h100-8x8", "--model-preset", "qwen2-vl-7b", "--backend", "heuristic")


@pytest.mark.parametrize(
    ("flag", "content", "needle"),
    [
        ("--batch", b'{"samples": [{"id": "\xff\xfe", "text_tokens": 5}]}', "not UTF-8"),
        ("--batch", b"[" * 100_000 + b"]" * 100_000, "too deeply"),
        ("--batch", b'{"samples": [{"id": "a", "text_tokens": ' + b"9" * 5000 + b"}]}", "--batch"),
        ("--options", b"[1, 2]", "--options"),
        ("--options", b'"fast"', "--options"),
        ("--profile", b"[" * 100_000 + b"]" * 100_000, "--profile"),
    ],
)
def test_every_bad_input_file_is_one_line_and_exit_2(tmp_path, flag, content, needle):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    args = ["plan", "--batch", OK_BATCH, *PRESETS]
    if flag == "--batch":
        args[2] = str(bad)
    else:
        args += [flag, str(bad)]
    _one_line(_dhp(*args), 2, needle)


def test_output_into_a_missing_folder_is_exit_4(tmp_path):
    _one_line(
        _dhp("plan", "--batch", OK_BATCH, *PRESETS, "--out", str(tmp_path / "missing" / "plan.json")), 4, "cannot write"
    )


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full to stand for a full disk")
def test_a_full_disk_is_exit_4():
    _one_line(_dhp("plan", "--batch", OK_BATCH, *PRESETS, "--out", "/dev/full"), 4, "No space left")
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "api.cli.main", "plan", "--batch", OK_BATCH, *PRESETS],
            stdout=full,
            stderr=subprocess.PIPE,
            cwd=ROOT,
        )
    _one_line(proc, 4, "No space left")


def test_a_closed_standard_output_is_exit_4_not_a_lost_plan():
    proc = subprocess.run(
        f"{sys.executable} -m api.cli.main plan --batch {OK_BATCH} {' '.join(PRESETS)} >&-",
        shell=True,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    _one_line(proc, 4, "standard output is closed")


def test_the_help_documents_the_exit_codes():
    out = _dhp("--help", text=True).stdout
    assert "4  I/O failure" in out and "2  bad input" in out


def test_serving_beyond_loopback_without_tokens_warns():
    from api.cli.serve import exposure_warning
    from api.service.settings import Settings

    assert "without bearer tokens" in exposure_warning(Settings(host="0.0.0.0"))
    assert exposure_warning(Settings(host="127.0.0.1")) is None
    assert exposure_warning(Settings(host="0.0.0.0", tokens="x" * 32)) is None
