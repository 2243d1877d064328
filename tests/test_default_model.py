"""A request that names no model is planned for the default preset (llama3-8b), and the answer says so:
``dhp plan`` and ``dhp validate`` on standard error, the service in ``model_note``; the plan names its model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from api_support import small_request

from api.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
BATCH = str(ROOT / "examples" / "batch_small.json")
NOTE = "model: llama3-8b (default; pass --model-preset or --model)"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def plan_args(*extra: str) -> list[str]:
    return ["plan", "--batch", BATCH, "--cluster-preset", "h100-8x8", "--backend", "heuristic", *extra]


def test_the_cli_says_when_it_plans_for_the_default_model(capsys):
    code, out, err = run(capsys, *plan_args("--no-shards"))
    assert code == 0 and err.splitlines() == [NOTE]
    assert json.loads(out)["model"] == "llama3-8b"


def test_the_summary_names_the_default_model_with_its_note(capsys):
    code, out, _ = run(capsys, *plan_args("--summary"))
    assert code == 0 and NOTE in out.splitlines()


def test_a_named_model_gets_no_note(capsys):
    code, out, err = run(capsys, *plan_args("--no-shards", "--model-preset", "qwen2-vl-7b"))
    assert code == 0 and err == ""
    assert json.loads(out)["model"] == "qwen2-vl-7b"
    code, out, err = run(capsys, *plan_args("--summary", "--model-preset", "qwen2-vl-7b"))
    assert code == 0 and err == "" and "model: qwen2-vl-7b" in out.splitlines()


def test_validate_says_it_checks_against_the_default_model(capsys, tmp_path):
    code, out, _ = run(capsys, *plan_args("--no-shards"))
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(out)
    code, out, err = run(capsys, "validate", "--plan", str(plan_file), "--batch", BATCH, "--cluster-preset", "h100-8x8")
    assert code == 0 and out.startswith("valid") and err.splitlines() == [NOTE]


def test_a_failure_stays_one_line_on_standard_error(capsys, tmp_path):
    plan_file = tmp_path / "plan.json"
    plan_file.write_text("[1, 2]")
    code, _, err = run(capsys, "validate", "--plan", str(plan_file), "--batch", BATCH, "--cluster-preset", "h100-8x8")
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: plan"), err


@pytest.fixture
def client(make_client):
    return make_client()


def test_the_service_says_when_it_plans_for_the_default_model(client):
    req = small_request(n=8)
    del req["model_preset"]
    r = client.post("/v1/plans", json=req)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["model"] == "llama3-8b"
    assert body["model_note"] == "llama3-8b (default; send model or model_preset)"
    # The same request naming the default model is answered from the same plan, without the note.
    named = client.post("/v1/plans", json={**req, "model_preset": "llama3-8b"})
    assert named.headers["x-plan-cache"] == "hit" and named.json()["id"] == body["id"]
    assert "model_note" not in named.json() and named.json()["model"] == "llama3-8b"


def test_the_service_names_the_model_it_was_asked_for(client):
    body = client.post("/v1/plans", json=small_request(n=8)).json()
    assert body["model"] == "qwen2-vl-7b" and "model_note" not in body


def test_a_plan_ahead_answer_carries_the_note(client):
    req = {**small_request(n=8), "wait": False}
    del req["model_preset"]
    r = client.post("/v1/plans", json=req)
    assert r.status_code == 202, r.text
    assert r.json()["model_note"] == "llama3-8b (default; send model or model_preset)"
