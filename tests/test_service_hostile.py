"""Hostile input never gives 500: NUL bytes and over-long text, ids that cannot exist, token counts that
multiply past 64-bit integers and cost models that give non-finite times are refused naming the field, on
SQLite and PostgreSQL alike."""

from __future__ import annotations

import json
import os

import pytest
from api_support import empty_postgres, small_request
from fastapi.testclient import TestClient

from api.app import create_app
from api.cli.main import main
from api.service.settings import Settings
from optimizer.costs.zoo import load_profile

PG_URL = os.environ.get("DHP_TEST_DATABASE_URL")
HUGE_VIDEO = {"frames": 10**9, "tokens_per_frame": 10**9}


@pytest.fixture(params=["sqlite", "postgresql"])
def client(request, tmp_path):
    if request.param == "sqlite":
        settings = Settings(data_dir=tmp_path / "data")
    else:
        if not PG_URL:
            pytest.skip("DHP_TEST_DATABASE_URL is not set: no PostgreSQL server to test against (.ci/run starts one)")
        empty_postgres(PG_URL).close()  # a clean schema for every test
        settings = Settings(database_url=PG_URL, data_dir=tmp_path / "data")
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


def problem(r, status, field=None):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    if field is not None:
        assert r.json().get("field") == field, r.json()
    return r.json()


@pytest.mark.parametrize("plan_id", ["ab%00cd", "a" * 70, "%E2%98%83", "x%01y"])
def test_ids_that_cannot_exist_are_404(client, plan_id):
    """Every /v1 route that takes an id (read from the application's routers) answers 404 naming it."""
    from bench.hostile import BODIES, id_routes

    routes = [(method, route) for method, route in id_routes() if route.startswith("/v1/")]
    assert ("POST", "/v1/plans/{}/feedback") in routes and ("GET", "/v1/jobs/{}") in routes
    for method, route in routes:
        field = "job_id" if route.startswith("/v1/jobs/") else "plan_id"
        body = BODIES.get(route, b"{}" if method == "POST" else None)
        answer = client.request(
            method, route.format(plan_id), content=body, headers={"Content-Type": "application/json"}
        )
        problem(answer, 404, field)


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/v1/plans", "cluster"),
        ("/v1/plans", "model"),
        ("/v1/plans", "backend"),
        ("/v1/dashboard/plans", "cluster"),
        ("/v1/dashboard/calibration", "model"),
        ("/v1/dashboard/calibration", "profile"),
    ],
)
def test_text_filters_with_control_characters_or_too_long_are_422(client, path, name):
    problem(client.get(path, params={name: "a\x00b"}), 422, name)
    problem(client.get(path, params={name: "tab\there"}), 422, name)
    problem(client.get(path, params={name: "n" * 2001}), 422, name)
    assert client.get(path, params={name: "h100-8x8"}).status_code == 200


def test_cluster_and_model_names_are_checked_before_they_are_stored(client):
    req = small_request(n=4)
    model = client.get("/v1/presets").json()["models"]["qwen2-vl-7b"]
    for name in ("a\x00b", "n" * 129):
        problem(
            client.post("/v1/plans", json={**req, "cluster": {"name": name, "nodes": 2, "gpus_per_node": 8}}),
            422,
            "cluster.name",
        )
        problem(
            client.post("/v1/plans", json={**req, "model_preset": None, "model": {**model, "name": name}}),
            422,
            "model.name",
        )
        problem(
            client.post(
                "/v1/plans", json={**req, "wait": False, "cluster": {"name": name, "nodes": 2, "gpus_per_node": 8}}
            ),
            422,
            "cluster.name",
        )
    ok = client.post("/v1/plans", json={**req, "cluster": {"name": "n" * 128, "nodes": 2, "gpus_per_node": 8}})
    assert ok.status_code == 201, ok.text
    assert client.get("/v1/plans", params={"cluster": "n" * 128}).json()["total"] == 1
    # One text rule for every string of a request (optimizer/problem/text.py): a NUL in a sample id is refused too.
    nul_id = {**req, "batch": {"samples": [{"id": "v\x00", "text_tokens": 500}]}}
    problem(client.post("/v1/plans", json=nul_id), 422, "batch.samples[0].id")


def test_token_products_beyond_64_bits_are_422_naming_the_sample(client):
    req = small_request(n=4)
    one = {**req, "batch": {"samples": [{"id": "v", "text_tokens": 5, "videos": [HUGE_VIDEO] * 10}]}}
    body = problem(client.post("/v1/plans", json=one), 422, "batch.samples[0]")
    assert "tokens" in body["detail"]
    problem(client.post("/v1/plans", json={**one, "wait": False}), 422, "batch.samples[0]")
    # Each sample within its own limit, the batch's sum beyond it.
    many = {
        **req,
        "batch": {
            "samples": [{"id": f"v{i}", "videos": [{"frames": 10**9, "tokens_per_frame": 1000}]} for i in range(1001)]
        },
    }
    problem(client.post("/v1/plans", json=many), 422, "batch.samples")


def test_non_finite_step_times_are_422(client):
    profile = load_profile("flexsp-gpt7b", "profile")
    profile["time"]["quadratic"] = 1e300
    # refused at the coefficient, by its range, before any step time can overflow
    body = problem(
        client.post("/v1/plans", json={**small_request(n=4), "profile": profile}), 422, "profile.time.quadratic"
    )
    assert "finite" in body["detail"] and "from 0 to" in body["detail"]


def test_the_command_line_refuses_token_overflow_with_one_line(tmp_path, capsys):
    batch = tmp_path / "batch.json"
    batch.write_text(json.dumps({"samples": [{"id": "v", "text_tokens": 5, "videos": [HUGE_VIDEO] * 10}]}))
    code = main(
        [
            "plan",
            "--batch",
            str(batch),
            "--cluster-preset",
            "h100-8x8",
            "--model-preset",
            "qwen2-vl-7b",
            "--backend",
            "heuristic",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "batch.samples[0]" in err


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"measured_step_time_s": 1.0, "metrics": {"mem": NaN}}', "metrics.mem"),
        ('{"measured_step_time_s": 1.0, "metrics": {"mem": Infinity}}', "metrics.mem"),
        ('{"measured_step_time_s": "1.5"}', "measured_step_time_s"),
        ('{"measured_step_time_s": 1.0, "metrics": {"mem": "7"}}', "metrics.mem"),
        ('{"measured_step_time_s": 1.0, "step": "3"}', "step"),
        ('{"measured_step_time_s": 1.0, "group_times_s": [[NaN]]}', "group_times_s[0][0]"),
    ],
)
def test_feedback_takes_finite_json_numbers_only(client, body, field):
    plan = client.post("/v1/plans", json=small_request(n=4)).json()
    problem(
        client.post(f"/v1/plans/{plan['id']}/feedback", content=body, headers={"content-type": "application/json"}),
        422,
        field,
    )
    assert (
        client.post(
            f"/v1/plans/{plan['id']}/feedback", json={"measured_step_time_s": 2, "metrics": {"mem": 7}}
        ).status_code
        == 201
    )


def test_a_non_finite_budget_is_named_as_such(client):
    body = json.dumps(small_request(n=4))[:-2] + ', "time_budget_ms": NaN}}'
    assert json.loads(body.replace("NaN", "1"))["options"]["time_budget_ms"] == 1
    found = problem(
        client.post("/v1/plans", content=body, headers={"content-type": "application/json"}),
        422,
        "options.time_budget_ms",
    )
    assert "finite" in found["detail"]


def test_the_openapi_documents_the_statuses_of_id_routes(client):
    paths = client.get("/openapi.json").json()["paths"]
    id_paths = [path for path in paths if "{plan_id}" in path or "{job_id}" in path]
    assert {"/v1/plans/{plan_id}/feedback", "/v1/jobs/{job_id}"} <= set(id_paths)
    for path in id_paths:
        for op in paths[path].values():
            assert {"404", "401", "422", "503"} <= set(op["responses"]), (path, sorted(op["responses"]))
    assert "409" in paths["/v1/plans/{plan_id}/feedback"]["post"]["responses"]
    assert "401" in paths["/v1/presets"]["get"]["responses"]
