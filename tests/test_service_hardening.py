"""Hostile and careless clients: text no encoder takes, tokens checked before bodies, stalled bodies, production
without tokens whatever server runs the app, and idempotency keys bound to their bodies."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from api_support import small_request

from api.cli.main import main
from api.local_server import ROOT, LocalServer, free_port

TOKEN = "t" * 24


def _raw(doc: dict) -> bytes:
    """JSON text with lone surrogates kept as escapes (``json.dumps`` writes them as ``\\udXXX``)."""
    return json.dumps(doc).encode()


def _problem(r: httpx.Response, status: int, field: str | None = None) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["hint"]
    if field is not None:
        assert body["field"] == field, body
    return body


@pytest.mark.parametrize(
    "where, field",
    [
        (lambda d, bad: d.update(cluster={"name": bad, "nodes": 1, "gpus_per_node": 8}), "cluster.name"),
        (
            lambda d, bad: d.update(
                model={**json.loads(Path(ROOT, "optimizer/presets/models/qwen2-vl-7b.json").read_text()), "name": bad}
            ),
            "model.name",
        ),
        (lambda d, bad: d.update(profile={"source": bad}), "profile.source"),
        (lambda d, bad: d["batch"]["samples"][2].update(id=bad), "batch.samples[2].id"),
    ],
)
@pytest.mark.parametrize("bad", ["\ud800", "a\udc00b", "a\u0000b"])
def test_nul_and_lone_surrogates_are_refused_naming_the_field(make_client, where, field, bad):
    client = make_client()
    doc = small_request(n=4)
    doc.pop("model_preset") if field == "model.name" else None
    where(doc, bad)
    for wait in (True, False):
        r = client.post("/v1/plans", content=_raw({**doc, "wait": wait}), headers={"content-type": "application/json"})
        body = _problem(r, 422, field)
        assert "NUL" in body["detail"] or "surrogate" in body["detail"]


def test_a_surrogate_pair_is_text_like_any_other(make_client):
    client = make_client()
    doc = small_request(n=4)
    doc["batch"]["samples"][0]["id"] = "\U0001f600"  # json.dumps writes the pair \ud83d\ude00
    r = client.post("/v1/plans", content=_raw(doc), headers={"content-type": "application/json"})
    assert r.status_code == 201, r.text
    assert "\U0001f600" in {s for mb in r.json()["micro_batches"] for g in mb["groups"] for s in g["samples"]}


def test_jobs_refuse_bad_text_at_once(make_client):
    client = make_client()
    samples = small_request(n=8)["batch"]["samples"]
    samples[3]["id"] = "\udfff"
    r = client.post(
        "/v1/jobs",
        content=_raw(
            {"dataset": {"samples": samples}, "global_batch_size": 4, "cluster": {"nodes": 1, "gpus_per_node": 8}}
        ),
        headers={"content-type": "application/json"},
    )
    _problem(r, 422, "dataset.samples[3].id")


def test_feedback_notes_with_nul_are_refused(make_client):
    client = make_client()
    plan = client.post("/v1/plans", json=small_request(n=4)).json()
    r = client.post(
        f"/v1/plans/{plan['id']}/feedback",
        content=_raw({"measured_step_time_s": 1.0, "notes": "a\u0000b"}),
        headers={"content-type": "application/json"},
    )
    _problem(r, 422, "notes")


def test_the_command_line_refuses_bad_text_in_one_line(tmp_path, capsys):
    batch = small_request(n=4)["batch"]
    batch["samples"][1]["id"] = "\ud800"
    path = tmp_path / "batch.json"
    path.write_text(json.dumps(batch))
    assert (
        main(["plan", "--batch", str(path), "--nodes", "1", "--gpus-per-node", "8", "--model-preset", "qwen2-vl-7b"])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "samples[1].id" in err and "surrogate" in err, err


def test_nul_in_profile_source_is_refused_on_postgresql(tmp_path):
    url = os.environ.get("DHP_TEST_DATABASE_URL")
    if not url:
        pytest.skip("DHP_TEST_DATABASE_URL is not set (.ci/run starts PostgreSQL)")
    from api_support import empty_postgres
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.service.settings import Settings

    empty_postgres(url).close()
    with TestClient(create_app(Settings(data_dir=tmp_path, database_url=url)), raise_server_exceptions=False) as client:
        for wait in (True, False):
            doc = {**small_request(n=4), "profile": {"source": "a\u0000b"}, "wait": wait}
            _problem(
                client.post("/v1/plans", content=_raw(doc), headers={"content-type": "application/json"}),
                422,
                "profile.source",
            )


def test_the_token_is_checked_before_the_body_is_read(make_client):
    client = make_client(tokens=TOKEN)
    big = (
        b'{"batch": {"samples": ['
        + b",".join(b'{"id": "s%d", "text_tokens": 100}' % k for k in range(400_000))
        + b"]}}"
    )
    assert len(big) > 12 * 2**20
    for body in (big, b'{"batch": [1, 2,', b"\xff\xfe not json"):
        r = client.post("/v1/plans", content=body, headers={"content-type": "application/json"})
        _problem(r, 401, "Authorization")
    r = client.post(
        "/v1/plans",
        content=b'{"batch": [1, 2,',
        headers={"content-type": "application/json", "authorization": f"Bearer {TOKEN}"},
    )
    _problem(r, 422)  # with the token, the body is read and its fault named


def test_feedback_under_a_used_idempotency_key_with_another_body_is_refused(make_client):
    client = make_client()
    plan = client.post("/v1/plans", json=small_request(n=4)).json()
    url, key = f"/v1/plans/{plan['id']}/feedback", {"Idempotency-Key": "step-17"}
    assert client.post(url, json={"measured_step_time_s": 1.0}, headers=key).status_code == 201
    assert client.post(url, json={"measured_step_time_s": 1.0}, headers=key).status_code == 200  # a retry
    _problem(client.post(url, json={"measured_step_time_s": 9.0}, headers=key), 422, "Idempotency-Key")
    assert [f["measured_step_time_s"] for f in client.get(url).json()] == [1.0]


def _stall(port: int, declared: int, sent: int, results: list, key: int) -> None:
    """Declare ``declared`` bytes, send ``sent`` and wait: what the server answers, and when."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(
            b"POST /v1/plans HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + b"\r\nContent-Length: %d\r\n\r\n" % declared
            + b'{"batch": "'
            + b"x" * (sent - 11)
        )
        began = time.monotonic()
        s.settimeout(30)
        answer = s.recv(65536)
        results[key] = (answer.split(b"\r\n", 1)[0], time.monotonic() - began)


def test_stalled_bodies_neither_lock_out_others_nor_stay_held(tmp_path):
    server = LocalServer(tmp_path / "d", env={"DHP_TOKENS": TOKEN, "DHP_BODY_TIMEOUT_S": "3"})
    try:
        results: list = [None, None]
        threads = [threading.Thread(target=_stall, args=(server.port, 16 * 2**20, 2**20, results, k)) for k in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        r = httpx.post(
            server.url + "/v1/plans", json=small_request(n=4), headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        )
        assert r.status_code == 201, r.text
        for t in threads:
            t.join(30)
        for status, waited in results:
            assert status == b"HTTP/1.1 408 Request Timeout" and waited < 10, (status, waited)
    finally:
        server.stop()


def _outside_address() -> str | None:
    """An address of this machine that is not loopback (None when it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outgoing interface
            host = s.getsockname()[0]
        except OSError:
            return None
    return None if host.startswith("127.") or host == "0.0.0.0" else host


def test_production_without_tokens_serves_no_outside_connection_whatever_server_runs_it(tmp_path):
    outside = _outside_address()
    if outside is None:
        pytest.skip("this machine has no address but loopback")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DHP_")} | {
        "DHP_ENVIRONMENT": "production",
        "DHP_DATA_DIR": str(tmp_path),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "api.app:create_app", "--host", "0.0.0.0", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        assert (
            httpx.get(f"http://127.0.0.1:{port}/v1/presets", timeout=5).status_code == 200
        )  # loopback: as dhp serve allows
        r = httpx.get(f"http://{outside}:{port}/v1/presets", timeout=5)
        assert "DHP_TOKENS" in _problem(r, 403)["hint"]
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert "without DHP_TOKENS" in out  # said at start-up, not only per request
