"""The planning service through the ASGI client: plans, plan-ahead, cache, listing, feedback, errors, limits, auth."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from api_support import ROOT, assert_verified, small_request
from fastapi.testclient import TestClient

from api.app import create_app
from api.service.settings import Settings
from optimizer.problem.documents import problem_from_json
from planning.planner import plan as run_planner


@pytest.fixture
def client(make_client):
    return make_client()


def assert_problem(r, status, field=None):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["status"] == status and body["title"] and body["detail"] and body["type"].startswith("https://")
    if field is not None:
        assert body.get("field") == field, body
    return body


def test_plan_is_verified_and_has_the_cli_shape(client):
    req = small_request()
    r = client.post("/v1/plans", json=req)
    assert r.status_code == 201, r.text
    doc = r.json()
    assert doc["status"] == "done" and len(doc["id"]) == 32 and doc["created_at"]
    assert r.headers["location"] == f"/v1/plans/{doc['id']}"
    assert_verified(doc, req)
    expected = run_planner(problem_from_json(req)).to_json()
    assert set(doc) - {"id", "status", "created_at"} == set(expected)
    assert doc["micro_batches"] == expected["micro_batches"]  # the heuristic is deterministic
    assert doc["solver"]["backend"] == "heuristic"


def test_cli_input_files_work_unchanged(client):
    files = {
        k: json.loads((ROOT / "examples" / f).read_text())
        for k, f in (
            ("batch", "batch_small.json"),
            ("cluster", "cluster.json"),
            ("model", "model.json"),
            ("options", "options.json"),
        )
    }
    files["options"] = {**files["options"], "backend": "heuristic"}
    r = client.post("/v1/plans", json=files)
    assert r.status_code == 201, r.text
    assert_verified(r.json(), files)


def test_identical_requests_hit_the_plan_cache(client):
    req = small_request(seed=3)
    first = client.post("/v1/plans", json=req)
    second = client.post("/v1/plans", json=req)
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.headers["x-plan-cache"] == "hit" and second.json()["id"] == first.json()["id"]
    # The same request with a preset named instead of the equivalent inline options still normalises alike.
    same = {**req, "options": {**req["options"], "degree_policy": "any"}}
    assert client.post("/v1/plans", json=same).headers["x-plan-cache"] == "hit"
    fresh = client.post("/v1/plans", json={**req, "cache": False})
    assert fresh.status_code == 201 and fresh.json()["id"] != first.json()["id"]
    metrics = client.get("/metrics").text
    assert "dhp_plan_cache_hits_total 2.0" in metrics


def test_plan_ahead_then_long_poll(client):
    req = {**small_request(seed=5), "wait": False}
    r = client.post("/v1/plans", json=req)
    assert r.status_code == 202, r.text
    pid = r.json()["id"]
    assert r.json()["status"] in ("pending", "done")
    got = client.get(f"/v1/plans/{pid}", params={"wait_ms": 20000}).json()
    assert got["status"] == "done" and got["id"] == pid
    assert_verified(got, req)


def test_plan_ahead_validates_before_accepting(client):
    bad = {**small_request(), "wait": False, "cluster": {"nodes": 0}}
    assert_problem(client.post("/v1/plans", json=bad), 422, "cluster.nodes")
    assert client.get("/v1/plans").json()["total"] == 0


def test_list_filters_and_pagination(client):
    ids = [client.post("/v1/plans", json=small_request(n=8, seed=s)).json()["id"] for s in range(5)]
    page = client.get("/v1/plans", params={"limit": 2}).json()
    assert page["total"] == 5 and len(page["items"]) == 2 and page["next_offset"] == 2
    seen = []
    offset = 0
    while offset is not None:
        page = client.get("/v1/plans", params={"limit": 2, "offset": offset}).json()
        seen += [i["id"] for i in page["items"]]
        offset = page["next_offset"]
    assert sorted(seen) == sorted(ids)
    assert (
        client.get("/v1/plans", params={"status": "done", "backend": "heuristic", "model": "qwen2-vl-7b"}).json()[
            "total"
        ]
        == 5
    )
    assert client.get("/v1/plans", params={"backend": "cpsat"}).json()["total"] == 0
    assert client.get("/v1/plans", params={"created_after": "2999-01-01T00:00:00Z"}).json()["total"] == 0
    assert client.get("/v1/plans", params={"created_before": "2999-01-01T00:00:00"}).json()["total"] == 5
    item = client.get("/v1/plans", params={"limit": 1}).json()["items"][0]
    assert item["n_samples"] == 8 and item["n_ranks"] == 16 and item["predicted_step_time_s"] > 0
    assert_problem(client.get("/v1/plans", params={"limit": 0}), 422, "limit")
    assert_problem(client.get("/v1/plans", params={"status": "lost"}), 422, "status")


def test_feedback_is_stored_beside_the_prediction(client):
    plan = client.post("/v1/plans", json=small_request(n=8)).json()
    shape = [[0.5] * len(mb["groups"]) for mb in plan["micro_batches"]]
    r = client.post(
        f"/v1/plans/{plan['id']}/feedback", json={"measured_step_time_s": 2.0, "group_times_s": shape, "step": 7}
    )
    assert r.status_code == 201, r.text
    fb = r.json()
    assert fb["predicted_step_time_s"] == pytest.approx(plan["predicted_step_time_s"])
    assert fb["measured_over_predicted"] == pytest.approx(2.0 / plan["predicted_step_time_s"])
    listed = client.get(f"/v1/plans/{plan['id']}/feedback").json()
    assert [f["id"] for f in listed] == [fb["id"]]
    assert listed[0]["group_times_s"] == shape and listed[0]["step"] == 7  # the per-group detail reads back
    assert "dhp_measured_over_predicted_count 1.0" in client.get("/metrics").text
    assert_problem(
        client.post(
            f"/v1/plans/{plan['id']}/feedback", json={"measured_step_time_s": 2.0, "group_times_s": shape + [[1.0]]}
        ),
        422,
        "group_times_s",
    )
    assert_problem(
        client.post(f"/v1/plans/{plan['id']}/feedback", json={"measured_step_time_s": -1}), 422, "measured_step_time_s"
    )
    assert_problem(client.post("/v1/plans/nope/feedback", json={"measured_step_time_s": 1.0}), 404, "plan_id")


def test_retried_feedback_is_stored_once(client):
    """A POST retried with its Idempotency-Key (the client sends one per call) stores the feedback once."""
    plan = client.post("/v1/plans", json=small_request(n=6)).json()
    url = f"/v1/plans/{plan['id']}/feedback"
    first = client.post(url, json={"measured_step_time_s": 2.0}, headers={"Idempotency-Key": "k-1"})
    again = client.post(url, json={"measured_step_time_s": 2.0}, headers={"Idempotency-Key": "k-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    client.post(url, json={"measured_step_time_s": 2.1}, headers={"Idempotency-Key": "k-2"})
    client.post(url, json={"measured_step_time_s": 2.2})
    client.post(url, json={"measured_step_time_s": 2.2})  # no key: two sends are two steps
    assert [f["measured_step_time_s"] for f in client.get(url).json()] == [2.0, 2.1, 2.2, 2.2]
    assert "dhp_measured_over_predicted_count 4.0" in client.get("/metrics").text  # the retry is not measured twice
    assert_problem(
        client.post(url, json={"measured_step_time_s": 2.0}, headers={"Idempotency-Key": "x" * 65}),
        422,
        "idempotency-key",
    )


def test_errors_are_problem_documents_naming_the_field(client):
    req = small_request(n=4)
    req["batch"]["samples"][2]["text_tokens"] = -5
    body = assert_problem(client.post("/v1/plans", json=req), 422, "batch.samples[2].text_tokens")
    assert body["hint"]
    assert_problem(
        client.post("/v1/plans", json={**small_request(), "cluster_preset": "h100-8x8"}), 422, "cluster_preset"
    )
    assert_problem(client.post("/v1/plans", json={**small_request(), "model_preset": "gpt-9"}), 422, "model_preset")
    assert_problem(client.post("/v1/plans", json={**small_request(), "colour": "red"}), 422, "colour")
    assert_problem(client.post("/v1/plans", json={"cluster_preset": "h100-8x8"}), 422, "batch")
    assert_problem(
        client.post("/v1/plans", json={**small_request(), "options": {"backend": "magic"}}), 422, "options.backend"
    )
    assert_problem(client.post("/v1/plans", content=b"{not json", headers={"content-type": "application/json"}), 422)
    assert_problem(client.get("/v1/plans/0123456789abcdef0123456789abcdef"), 404, "plan_id")
    assert_problem(client.get("/v1/nothing-here"), 404)
    assert_problem(client.put("/v1/plans"), 405)


def test_infeasible_request_is_422(client):
    # One sample far larger than the memory of the whole cluster.
    req = {
        "batch": {"samples": [{"id": "huge", "text_tokens": 50_000_000}]},
        "cluster": {"nodes": 1, "gpus_per_node": 2},
        "model_preset": "llama3-8b",
        "options": {"backend": "heuristic"},
    }
    body = assert_problem(client.post("/v1/plans", json=req), 422)
    assert body["type"].endswith("/infeasible") and body["hint"]


def test_limits_from_settings(make_client):
    client = make_client(max_samples=10, max_ranks=8, max_budget_ms=500, max_body_bytes=4096)
    assert_problem(client.post("/v1/plans", json=small_request(n=11, nodes=1)), 422, "batch.samples")
    assert_problem(client.post("/v1/plans", json=small_request(n=4, nodes=2)), 422, "cluster")
    assert_problem(
        client.post("/v1/plans", json={**small_request(n=4, nodes=1), "cluster": None, "cluster_preset": "h100-8x8"}),
        422,
        "cluster_preset",
    )
    assert_problem(
        client.post("/v1/plans", json=small_request(n=4, nodes=1, time_budget_ms=501)), 422, "options.time_budget_ms"
    )
    big = small_request(n=100, nodes=1)
    assert_problem(client.post("/v1/plans", json=big), 413, "body")
    # Chunked upload without Content-Length is limited too.
    data = json.dumps(big).encode()
    r = client.post("/v1/plans", content=iter([data[:2000], data[2000:]]), headers={"content-type": "application/json"})
    assert_problem(r, 413, "body")
    assert client.post("/v1/plans", json=small_request(n=4, nodes=1, time_budget_ms=400)).status_code == 201


def test_bearer_tokens(make_client):
    client = make_client(tokens="alpha-token-0123456789,beta-token-0123456789")
    req = small_request(n=4)
    body = assert_problem(client.post("/v1/plans", json=req), 401, "Authorization")
    assert "Bearer" in client.get("/v1/presets").headers["www-authenticate"]
    assert body["hint"]
    assert_problem(client.get("/v1/presets", headers={"Authorization": "Bearer wrong"}), 401)
    ok = client.post("/v1/plans", json=req, headers={"Authorization": "Bearer beta-token-0123456789"})
    assert ok.status_code == 201
    for open_path in ("/healthz", "/readyz", "/metrics", "/docs", "/openapi.json"):
        assert client.get(open_path).status_code == 200, open_path


def test_settings_refuse_unsafe_production_defaults():
    with pytest.raises(ValueError, match="DHP_TOKENS"):
        Settings(environment="production", host="0.0.0.0")
    with pytest.raises(ValueError, match="shorter"):
        Settings(environment="production", host="0.0.0.0", tokens="short")
    Settings(environment="production", host="127.0.0.1")
    Settings(environment="production", host="0.0.0.0", tokens="x" * 32)
    Settings(environment="development", host="0.0.0.0")
    with pytest.raises(ValueError, match="unsafe test settings"):
        Settings(environment="test", host="::")


def test_settings_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DHP_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("DATABASE_URL", "postgres://u:p@db:5432/dhp")
    monkeypatch.setenv("DHP_SOLVE_WORKERS", "3")
    s = Settings()
    assert s.data_dir == Path(tmp_path) and s.solve_workers == 3
    assert s.sqlalchemy_url == "postgresql+psycopg://u:p@db:5432/dhp"
    monkeypatch.delenv("DATABASE_URL")
    assert Settings().sqlalchemy_url.startswith("sqlite:///") and Settings().sqlalchemy_url.endswith("dhp.sqlite3")


def test_beyond_capacity_answers_503_with_retry_after(make_client):
    client = make_client(solve_workers=1, queue_limit=0, retry_after_s=2)
    service = client.app.state.service
    release = threading.Event()
    started = threading.Event()
    original = service.plan_now

    def slow(*args):
        started.set()
        release.wait(10)
        return original(*args)

    service.plan_now = slow
    results = {}
    t = threading.Thread(target=lambda: results.setdefault("first", client.post("/v1/plans", json=small_request(n=4))))
    t.start()
    assert started.wait(10)
    r = client.post("/v1/plans", json=small_request(n=4, seed=1))
    body = assert_problem(r, 503)
    assert r.headers["retry-after"] == "2" and body["hint"]
    ready = client.get("/readyz").json()
    assert ready["solves_in_flight"] == 1 and ready["capacity"] == 1
    release.set()
    t.join(10)
    assert results["first"].status_code == 201
    assert "dhp_rejected_total 1.0" in client.get("/metrics").text


def test_budget_counts_from_arrival(client, monkeypatch):
    """One deadline per request, from its arrival; the request's own options are not rewritten."""
    import time

    import api.service.planning_service as solving

    seen = []
    original = solving.run_planner

    def spy(problem, deadline):
        seen.append((problem.options.time_budget_ms, deadline, time.perf_counter()))
        return original(problem, deadline=deadline)

    monkeypatch.setattr(solving, "run_planner", spy)
    before = time.perf_counter()
    client.post("/v1/plans", json=small_request(n=4, time_budget_ms=1000))
    ((budget, deadline, called),) = seen
    assert budget == 1000
    assert before <= deadline.start < called
    assert deadline.budget_ms == pytest.approx(1000)


def test_restart_keeps_every_plan(tmp_path):
    settings = Settings(data_dir=tmp_path / "data")
    with TestClient(create_app(settings)) as c1:
        made = {c1.post("/v1/plans", json=small_request(n=6, seed=s)).json()["id"]: s for s in range(4)}
        ahead = c1.post("/v1/plans", json={**small_request(n=6, seed=9), "wait": False}).json()["id"]
        assert c1.get(f"/v1/plans/{ahead}", params={"wait_ms": 20000}).json()["status"] == "done"
        before = {pid: c1.get(f"/v1/plans/{pid}").json() for pid in [*made, ahead]}
    with TestClient(create_app(settings)) as c2:
        assert c2.get("/v1/plans").json()["total"] == 5
        for pid, doc in before.items():
            assert c2.get(f"/v1/plans/{pid}").json() == doc
        # The plan cache survives too (through the store).
        again = c2.post("/v1/plans", json=small_request(n=6, seed=0))
        assert again.status_code == 200 and again.json()["id"] in made


def test_presets_health_metrics_docs(client):
    presets = client.get("/v1/presets").json()
    assert "h100-8x8" in presets["clusters"] and "qwen2-vl-7b" in presets["models"]
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json()["database"] == "ok"
    client.post("/v1/plans", json=small_request(n=4))
    text = client.get("/metrics").text
    for name in (
        "dhp_http_request_duration_seconds_bucket",
        "dhp_solve_duration_seconds_bucket",
        "dhp_plan_gap_bucket",
        "dhp_solve_queue_depth",
        "dhp_solves_in_flight",
        "dhp_solver_fallbacks_total",
    ):
        assert name in text, name
    assert 'route="/v1/plans"' in text and 'backend="heuristic"' in text
    docs = client.get("/docs").text
    assert "/static/swagger-ui-bundle.js" in docs and "cdn" not in docs.lower()
    assert client.get("/static/swagger-ui-bundle.js").status_code == 200
    spec = client.get("/openapi.json").json()
    assert {
        "/v1/plans",
        "/v1/plans/{plan_id}",
        "/v1/plans/{plan_id}/feedback",
        "/v1/presets",
        "/healthz",
        "/readyz",
        "/metrics",
    } <= set(spec["paths"])


def test_dhp_serve_refuses_unsafe_production_settings(monkeypatch, capsys):
    from api.cli.main import main

    monkeypatch.setenv("DHP_ENVIRONMENT", "production")
    monkeypatch.delenv("DHP_TOKENS", raising=False)
    assert main(["serve", "--host", "0.0.0.0", "--port", "8999"]) == 2
    err = capsys.readouterr().err
    assert "DHP_TOKENS" in err and "To fix" in err
    monkeypatch.setenv("DHP_ENVIRONMENT", "development")
    assert main(["serve", "--port", "99999"]) == 2
    assert "DHP_PORT" in capsys.readouterr().err


def test_solver_threads_are_capped(tmp_path):
    from api.service.translate import to_problem

    doc = {k: v for k, v in small_request(n=4, solver_workers=8).items()}
    assert to_problem(doc, Settings(data_dir=tmp_path, solver_threads=2)).options.solver_workers == 2
    assert to_problem(doc, Settings(data_dir=tmp_path, solver_threads=16)).options.solver_workers == 8


def test_a_plan_ahead_lost_in_a_stopped_server_is_reported_failed(make_client):
    from datetime import timedelta

    from api.store.repository import PlanRecord, utcnow

    client = make_client()
    assert client.app.state.service.resumed.wait(30)  # what was pending at start-up has been taken up
    store = client.app.state.store
    settings = client.app.state.settings
    old = PlanRecord(
        id="f" * 32,
        created_at=utcnow() - timedelta(seconds=settings.stale_after_s + 1),
        status="pending",
        request_hash="0" * 64,
        n_samples=4,
        n_ranks=16,
        request_json="{}",
    )
    young = PlanRecord(
        id="e" * 32,
        created_at=utcnow(),
        status="pending",
        request_hash="1" * 64,
        n_samples=4,
        n_ranks=16,
        request_json="{}",
    )
    store.add(old)
    store.add(young)
    lost = client.get(f"/v1/plans/{old.id}").json()
    assert lost["status"] == "failed" and lost["error"]["hint"]
    assert client.get(f"/v1/plans/{young.id}").json()["status"] == "pending"


def test_a_repeated_request_skips_validation(client, monkeypatch):
    import api.service.translate as translate

    req = small_request(n=6, seed=11)
    first = client.post("/v1/plans", json=req).json()
    calls = []
    original = translate.to_problem
    monkeypatch.setattr(translate, "to_problem", lambda *a: calls.append(1) or original(*a))
    again = client.post("/v1/plans", json=dict(reversed(list(req.items()))))  # same documents, other key order
    assert again.status_code == 200 and again.json()["id"] == first["id"] and calls == []
    other = client.post(
        "/v1/plans", json={**req, "options": {**req["options"], "degree_policy": "any"}}
    )  # the default, spelled out
    assert other.status_code == 200 and other.json()["id"] == first["id"] and calls == [1]


def test_an_unexpected_failure_is_a_500_problem_document(client):
    def broken(*args):
        raise RuntimeError("bug")

    client.app.state.service.plan_now = broken
    body = assert_problem(client.post("/v1/plans", json=small_request(n=4)), 500)
    assert body["type"].endswith("/internal") and "bug" not in body["detail"]  # no internals leak


def test_solver_libraries_are_loaded_at_start_up(tmp_path):
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("ortools") is None:
        pytest.skip("OR-Tools is not installed")
    code = (
        "import sys\n"
        "from fastapi.testclient import TestClient\n"
        "from api.app import create_app\n"
        "from api.service.settings import Settings\n"
        "app = create_app(Settings(data_dir=sys.argv[1]))\n"
        "before = 'ortools.sat.python.cp_model' in sys.modules\n"
        "with TestClient(app):\n"
        "    after = 'ortools.sat.python.cp_model' in sys.modules\n"
        "print(before, after)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


def test_existing_groups_and_reuse_options_reach_the_planner(client):
    """A request may carry the job's communicators; the plan then says which groups are new and what they cost."""
    req = small_request(group_reuse="prefer", new_group_cost_s=0.5)
    req["existing_groups"] = [[0, 1], [2, 3, 4], [8, 9, 10, 11]]
    r = client.post("/v1/plans", json=req)
    assert r.status_code == 201, r.text
    doc = r.json()
    expected = run_planner(problem_from_json(req)).to_json()
    assert doc["new_communicators"] == expected["new_communicators"]
    assert doc["group_setup_s"] == pytest.approx(0.5 * len(doc["new_communicators"]))
    bad = dict(req, existing_groups=[[0, 999]])
    r = client.post("/v1/plans", json=bad)
    assert r.status_code == 422 and "existing_groups" in r.json()["field"]


def test_a_wrong_method_lists_every_method_of_the_path(client):
    r = client.options("/v1/plans")
    assert r.status_code == 405 and r.headers["allow"] == "GET, POST"
    assert client.delete("/v1/presets").headers["allow"] == "GET"


def test_time_filters_take_dates_and_times_only(client):
    for value in ("0.5", "1700000000", "2026-01-31"):
        r = client.get("/v1/plans", params={"created_before": value})
        assert r.status_code == 422 and r.json()["field"] == "created_before", value
    assert client.get("/v1/plans", params={"created_before": "2026-01-31T12:00:00Z"}).status_code == 200


def test_the_openapi_document_states_this_deployments_limits(make_client):
    schemas = make_client(max_budget_ms=200, max_samples=64).get("/openapi.json").json()["components"]["schemas"]
    budget = schemas["OptionsIn"]["properties"]["time_budget_ms"]["anyOf"][0]
    samples = schemas["PlanRequest"]["properties"]["batch"]["properties"]["samples"]
    assert budget["maximum"] == 200 and samples["minItems"] == 1 and samples["maxItems"] == 64


def test_plan_ahead_with_an_auto_budget_takes_a_share_of_the_previous_step(make_client):
    client = make_client(max_budget_ms=1500)
    step = {**small_request(n=6, seed=2, time_budget_ms="auto", previous_step_s=0.6), "wait": False}
    r = client.post("/v1/plans", json=step)
    assert r.status_code == 202, r.text
    done = client.get(f"/v1/plans/{r.json()['id']}", params={"wait_ms": 20000}).json()
    assert done["status"] == "done", done
    assert done["solver"]["budget_ms"] == 300.0
    assert done["solver"]["details"]["budget"] == '"auto": 0.5 x the previous step\'s 0.6 s = 300 ms'
    assert_verified(done, step)
    listed = client.get("/v1/plans").json()["items"]
    assert [row["budget_ms"] for row in listed] == [300.0]  # the record's column: what "auto" came to
    long = client.post("/v1/plans", json=small_request(n=6, seed=3, time_budget_ms="auto", previous_step_s=9.0))
    assert long.status_code == 201, long.text
    assert long.json()["solver"]["budget_ms"] == 1500.0  # capped at this deployment's limit, not refused
    assert long.json()["solver"]["details"]["budget"].endswith("= 4500 ms, capped at 1500 ms")
    first = client.post("/v1/plans", json=small_request(n=6, seed=4, time_budget_ms="auto"))
    assert first.status_code == 201, first.text
    assert first.json()["solver"]["budget_ms"] == 200.0
    assert first.json()["solver"]["details"]["budget"] == '"auto" without options.previous_step_s: the default 200 ms'
    bad = assert_problem(client.post("/v1/plans", json=small_request(n=6, time_budget_ms="soon")), 422)
    assert bad["field"] == "options.time_budget_ms" and '"auto"' in bad["hint"]
