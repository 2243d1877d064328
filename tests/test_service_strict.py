"""Strict input at every door: typed request fields, existing groups as a set, generated sample ids,
number ranges of the documents, one-line command-line errors, malformed HTTP as a problem document,
and the dashboard's re-plan budget."""

from __future__ import annotations

import asyncio
import copy
import json
import socket
import uuid
from datetime import UTC, datetime

import pytest
from api_support import ROOT, ServerProcess, small_request

from api.cli.main import main
from api.service import translate
from api.store import PlanRecord
from optimizer.errors import ProblemError
from optimizer.presets import load_preset
from optimizer.problem.documents import (
    batch_from_json,
    cluster_from_json,
    model_from_json,
    problem_from_json,
    profile_from_json,
)

PROFILE = json.loads((ROOT / "examples" / "profile.json").read_text())


@pytest.fixture
def client(make_client):
    return make_client()


def _problem(r, status: int, field: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["field"] == field and body["hint"] and body["detail"], body
    return body


# -- 1. strict types ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"wait": "false"}, "wait"),
        ({"cache": "yes"}, "cache"),
        ({"wait": 0}, "wait"),
        ({"existing_groups": [[True, False]]}, "existing_groups[0]"),
        ({"existing_groups": [["0", "1"]]}, "existing_groups[0]"),
        ({"cluster_preset": 8}, "cluster_preset"),
    ],
)
def test_plan_request_fields_are_not_coerced(client, extra, field):
    req = {**small_request(n=6), **extra}
    if "cluster_preset" in extra:
        req.pop("cluster")
    _problem(client.post("/v1/plans", json=req), 422, field)


@pytest.mark.parametrize(
    ("extra", "hint"),
    [
        ({"wait": "false"}, "true or false"),
        ({"options": {"backend": "fast"}}, "use one of"),
        ({"options": {"new_group_cost_s": "2"}}, "JSON number"),
        ({"options": {"time_budget_ms": "200"}}, 'in milliseconds, e.g. 200, or "auto"'),  # a number or a word
        ({"surprise": 1}, "remove the field"),
    ],
)
def test_a_type_error_says_how_to_fix_it(client, extra, hint):
    req = {**small_request(n=6), **extra}
    assert hint in client.post("/v1/plans", json=req).json()["hint"]


def test_a_json_integer_is_still_a_number(client):
    req = small_request(n=6, time_budget_ms=500)
    assert isinstance(req["options"]["time_budget_ms"], int)
    assert client.post("/v1/plans", json=req).status_code == 201


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"global_batch_size": "4"}, "global_batch_size"),
        ({"drop_last": "yes"}, "drop_last"),
        ({"workers": "2"}, "workers"),
        ({"max_steps": "3"}, "max_steps"),
        ({"workers": True}, "workers"),
        ({"existing_groups": [[True, False]]}, "existing_groups[0]"),
    ],
)
def test_job_request_fields_are_not_coerced(client, extra, field):
    pytest.importorskip("pyarrow")
    body = {
        "dataset": {"samples": [{"id": f"a{i}", "text_tokens": 100 + i} for i in range(8)]},
        "global_batch_size": 4,
        "cluster": {"nodes": 1, "gpus_per_node": 8},
        "model_preset": "llama3-8b",
        **extra,
    }
    _problem(client.post("/v1/jobs", json=body), 422, field)


def test_request_documents_check_the_envelope_too():
    base = {"batch": {"samples": [{"id": "a", "text_tokens": 10}]}, "cluster": {"nodes": 1, "gpus_per_node": 8}}
    for key, value in (("wait", "false"), ("cache", "yes")):
        with pytest.raises(ProblemError) as err:
            problem_from_json({**base, key: value})
        assert err.value.field == key and err.value.hint
    problem_from_json({**base, "wait": False, "cache": True})  # a POST /v1/plans body is a request document


def test_job_files_follow_the_same_rules(tmp_path, capsys):
    job = {
        "dataset": {"samples": [{"id": f"a{i}", "text_tokens": 100} for i in range(4)]},
        "global_batch_size": "2",
        "cluster": {"nodes": 1, "gpus_per_node": 8},
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    code = main(["plan-epoch", "--job", str(path), "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "global_batch_size" in err[0]


# -- 2. existing groups are a set ----------------------------------------------------------------


def test_existing_groups_in_any_order_are_the_same_problem():
    base = {"batch": {"samples": [{"id": "a", "text_tokens": 10}]}, "cluster": {"nodes": 1, "gpus_per_node": 8}}
    orders = ([[0, 1], [2, 3], [0, 1, 2, 3]], [[3, 2, 1, 0], [3, 2], [1, 0]], [[2, 3], [0, 1], [1, 0], [0, 1, 2, 3]])
    problems = [problem_from_json({**base, "existing_groups": groups}) for groups in orders]
    assert {p.existing_groups for p in problems} == {((0, 1), (0, 1, 2, 3), (2, 3))}
    docs = [{**base, "existing_groups": groups} for groups in orders]
    assert len({translate.request_hash(d, p) for d, p in zip(docs, problems, strict=True)}) == 1


def test_reordered_existing_groups_hit_the_plan_cache(client):
    req = small_request(n=8, seed=21)
    first = client.post("/v1/plans", json={**req, "existing_groups": [[0, 1], [2, 3, 4, 5]]})
    again = client.post("/v1/plans", json={**req, "existing_groups": [[5, 4, 3, 2], [1, 0]]})
    assert first.status_code == 201 and again.status_code == 200 and again.headers["x-plan-cache"] == "hit"
    assert again.json()["id"] == first.json()["id"]


# -- 3. generated sample ids -----------------------------------------------------------------------


def test_generated_ids_never_clash_with_given_ones():
    batch = batch_from_json(
        {
            "samples": [
                {"text_tokens": 10},
                {"id": "s0", "text_tokens": 20},
                {"text_tokens": 30},
                {"id": "s0_2", "text_tokens": 40},
            ]
        }
    )
    ids = [s.id for s in batch.samples]
    assert len(set(ids)) == 4 and ids[1] == "s0" and ids[2] == "s2" and ids[3] == "s0_2"
    assert ids[0] not in ("s0", "s0_2")


def test_a_batch_with_some_ids_missing_plans(client):
    req = small_request(n=4)
    req["batch"]["samples"] = [{"text_tokens": 900}, {"id": "s0", "text_tokens": 2000}, {"id": "s1", "text_tokens": 50}]
    r = client.post("/v1/plans", json=req)
    assert r.status_code == 201, r.text


def test_a_repeated_given_id_names_both_samples():
    with pytest.raises(ProblemError) as err:
        batch_from_json(
            {"samples": [{"id": "a", "text_tokens": 1}, {"id": "b", "text_tokens": 1}, {"id": "a", "text_tokens": 2}]}
        )
    assert err.value.field == "batch.samples[2].id" and "samples[0]" in err.value.message


# -- 4. number ranges ---------------------------------------------------------------------------------


def _cluster() -> dict:
    return {
        "nodes": [{"count": 1, "gpus": 8, "gpu": {"name": "X", "memory_bytes": 80e9, "peak_flops": 9.9e14}}],
        "intra_bandwidth": 4.5e11,
        "inter_bandwidth": 5e10,
    }


def _set(doc: dict, path: str, value: float) -> dict:
    doc = copy.deepcopy(doc)
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    at = doc
    for k in keys[:-1]:
        at = at[k]
    at[keys[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("efficiency", 1e-300),
        ("efficiency", 2.0),
        ("intra_bandwidth", 1e-300),
        ("inter_bandwidth", 1e300),
        ("intra_latency", 1e300),
        ("memory_reserve_bytes", 1e300),
        ("nodes.0.gpu.memory_bytes", 1e-300),
        ("nodes.0.gpu.peak_flops", 1e300),
    ],
)
def test_cluster_numbers_have_a_range(path, value):
    with pytest.raises(ProblemError) as err:
        cluster_from_json(_set(_cluster(), path, value))
    field = "cluster." + path.replace("nodes.0", "nodes[0]")
    assert err.value.field == field and " to " in err.value.message and len(str(err.value)) < 300, str(err.value)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("capacity_tokens_per_rank", 1e-300),
        ("capacity_tokens_per_rank", 1e300),
        ("time.quadratic", 1e300),
        ("time.group_constant", 1e300),
        ("comm.bytes_per_token", 1e300),
        ("comm.bandwidth_bytes_per_s.inter", 1e-300),
        ("comm.bandwidth_bytes_per_s.intra.2", 1e-300),
        ("speed_by_gpu", {"A100-80GB": 1e-300}),
        ("capacity_tokens_per_rank", {"default": 18000, "A100-80GB": 1e-300}),
    ],
)
def test_profile_numbers_have_a_range(path, value):
    with pytest.raises(ProblemError) as err:
        profile_from_json(_set(PROFILE, path, value))
    assert (
        err.value.field.startswith("profile." + path.split(".")[0])
        and " to " in err.value.message
        and len(str(err.value)) < 300
    ), str(err.value)


def test_model_numbers_have_a_range():
    doc = load_preset("models", "qwen2-vl-7b", "model_preset")
    for path in ("llm.parameters", "vision.parameters"):
        with pytest.raises(ProblemError) as err:
            model_from_json(_set(doc, path, 1e300))
        assert err.value.field == "model." + path and " to " in err.value.message


def test_an_absurd_efficiency_is_refused_over_http(client):
    req = small_request(n=6)
    req["cluster"]["efficiency"] = 1e-300
    _problem(client.post("/v1/plans", json=req), 422, "cluster.efficiency")


def test_every_preset_is_within_the_ranges():
    from optimizer.costs.zoo import describe_presets

    presets = describe_presets()
    for name in presets["clusters"]:
        cluster_from_json(load_preset("clusters", name, "cluster_preset"))
    for name in presets["models"]:
        model_from_json(load_preset("models", name, "model_preset"))


# -- 5. one-line command-line errors ---------------------------------------------------------------------

BATCH = str(ROOT / "examples" / "batch_small.json")


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["plan", "--batch", BATCH, "--budget-ms", "abc"], ["dhp plan:", "--budget-ms", "'abc'", "e.g."]),
        (["plan", "--batch", BATCH, "--backend", "gurobi"], ["dhp plan:", "--backend", "'gurobi'", "heuristic"]),
        (["plan", "--batch", BATCH, "--nodes", "two"], ["dhp plan:", "--nodes", "'two'", "whole number"]),
        (["plan", "--batch", BATCH, "--budget-ms"], ["dhp plan:", "--budget-ms", "value"]),
        (["plan", "--cluster-preset", "h100-8x8"], ["dhp plan:", "--batch", "required"]),
        (
            ["plan", "--batch", BATCH, "--nodes", "2", "--cluster-preset", "h100-8x8"],
            ["dhp plan:", "--cluster-preset", "--nodes"],
        ),
        (["plan", "--batch", BATCH, "--budjet-ms", "5"], ["dhp plan:", "--budjet-ms", "--budget-ms"]),
        (["plna"], ["dhp:", "'plna'", "plan"]),
        ([], ["dhp:", "command", "plan"]),
        (["example", "--samples", "x"], ["dhp example:", "--samples", "e.g. --samples 512"]),
        (["serve", "--port", "http"], ["dhp serve:", "--port", "'http'"]),
        (
            ["plan-epoch", "--dataset", "d.jsonl", "--out", "o", "--workers", "many"],
            ["dhp plan-epoch:", "--workers", "'many'"],
        ),
        (["plan-epoch", "--out", "o"], ["dhp plan-epoch:", "--dataset", "--job"]),
        (["bench", "--ranks", "eight"], ["dhp bench:", "--ranks", "e.g. 8,64,512"]),
        (["profile", "--repeats", "lots"], ["dhp profile:", "--repeats", "e.g. --repeats 3"]),
    ],
)
def test_every_argument_error_is_one_line(capsys, argv, needles):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert exc.value.code == 2 and out == "" and len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "usage:" not in err and "Traceback" not in err


def test_help_is_still_the_full_text(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--help"])
    assert exc.value.code == 0 and "--budget-ms" in capsys.readouterr().out


# -- 6. malformed HTTP ---------------------------------------------------------------------------------------


def _raw(port: int, request: bytes) -> tuple[str, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    return status, {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}, body


def _assert_problem_400(status: str, headers: dict[str, str], body: bytes) -> dict:
    assert status.startswith("HTTP/1.1 400"), status
    assert headers["content-type"] == "application/problem+json" and headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    doc = json.loads(body)
    assert (
        doc["status"] == 400 and doc["type"].startswith("https://") and doc["title"] and doc["detail"] and doc["hint"]
    )
    return doc


@pytest.mark.parametrize("protocol", ["H11ProblemProtocol", "HttpToolsProblemProtocol"])
def test_each_protocol_answers_malformed_http_with_a_problem_document(protocol):
    """The protocol classes alone, on a stand-in transport: what they write for a request uvicorn cannot parse."""
    import api.service.http_protocol as hp

    cls = getattr(hp, protocol, None)
    if cls is None:
        pytest.skip(f"{protocol} needs its parser library")
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    class Transport(asyncio.Transport):
        def __init__(self) -> None:
            super().__init__()
            self.data, self.closed = b"", False

        def write(self, data: bytes | bytearray | memoryview) -> None:
            self.data += bytes(data)

        def close(self) -> None:
            self.closed = True

        def is_closing(self) -> bool:
            return self.closed

        def get_extra_info(self, name: str, default: object = None) -> object:
            return ("127.0.0.1", 8000) if name in ("sockname", "peername") else default

    async def app(scope, receive, send):  # never reached
        raise AssertionError("the app was called")

    config = Config(app, http=cls, log_level="critical")
    config.load()
    loop = asyncio.new_event_loop()
    try:
        proto = cls(config=config, server_state=ServerState(), app_state={}, _loop=loop)
        transport = Transport()
        proto.connection_made(transport)
        proto.data_received(b"POST /v1/plans HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}")
    finally:
        loop.close()
    head, _, body = transport.data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    assert transport.closed
    _assert_problem_400(status, {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}, body)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("strict-served"))
    yield srv
    srv.stop()


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /v1/plans HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: abc\r\n\r\n{}",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header: 1\r\n\r\n",
        b"NOT A REQUEST\r\n\r\n",
    ],
)
def test_dhp_serve_answers_malformed_http_with_a_problem_document(served, request_bytes):
    doc = _assert_problem_400(*_raw(served.port, request_bytes))
    assert doc["type"].endswith("/malformed-http")
    status, _, body = _raw(served.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status.startswith("HTTP/1.1 200") and json.loads(body)["status"]  # the server goes on


# -- 7. the dashboard's re-plan budget --------------------------------------------------------------------------


def _stored(client, status: str, budget_ms: float) -> str:
    req = small_request(n=10, seed=31, time_budget_ms=budget_ms)
    doc = translate.request_document(translate.PlanRequest.model_validate(req))
    problem = translate.to_problem(doc, client.app.state.settings)
    plan_id = uuid.uuid4().hex
    client.app.state.store.add(
        PlanRecord(
            id=plan_id,
            created_at=datetime.now(UTC),
            status=status,
            request_hash=translate.request_hash(doc, problem),
            n_samples=len(problem.batch),
            n_ranks=problem.domain_size,
            request_json=translate.request_text(doc),
        )
    )
    return plan_id


def test_a_replan_without_a_budget_runs_the_dashboard_default(client):
    from api.dashboard.tuning import REPLAN_BUDGET_MS

    plan_id = _stored(client, "pending", 20_000)
    r = client.post(f"/v1/dashboard/plans/{plan_id}/replan", json={})
    assert r.status_code == 200, r.text  # a plan still being solved can be planned again: its request is stored
    assert r.json()["options"]["time_budget_ms"] == REPLAN_BUDGET_MS
    asked = client.post(f"/v1/dashboard/plans/{plan_id}/replan", json={"options": {"time_budget_ms": 50}}).json()
    assert asked["options"]["time_budget_ms"] == 50


def test_the_replan_default_is_capped_by_the_server(make_client):
    client = make_client(max_budget_ms=80)
    plan_id = _stored(client, "done", 60)
    r = client.post(f"/v1/dashboard/plans/{plan_id}/replan", json={"options": {"backend": "heuristic"}})
    assert r.status_code == 200, r.text
    assert r.json()["options"]["time_budget_ms"] == 80


def test_job_files_take_the_workers_field_post_v1_jobs_takes(tmp_path, capsys):
    job = {
        "dataset": {"samples": [{"id": f"a{i}", "text_tokens": 100} for i in range(4)]},
        "global_batch_size": 2,
        "cluster": {"nodes": 1, "gpus_per_node": 8},
        "workers": 1,
    }
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    assert main(["plan-epoch", "--job", str(path), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    index = json.loads((tmp_path / "out" / "index.json").read_text())
    assert index["run"]["workers"] == 1
    capsys.readouterr()
    for bad in (0, 257, "2", True, 1.5):
        path.write_text(json.dumps({**job, "workers": bad}))
        code = main(["plan-epoch", "--job", str(path), "--out", str(tmp_path / f"bad-{bad}"), "--no-progress"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith("error: workers:"), (bad, err)
