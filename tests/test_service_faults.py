"""Store faults: a store that does not answer is 503 with Retry-After (never 500), the client retries it, a plan-ahead
answer solved while the store is down is stored when it comes back, and plan-ahead requests left pending by a process
that stopped are solved when the service starts again."""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import timedelta

import httpx
import pytest
from api_support import assert_verified, small_request
from fastapi.testclient import TestClient
from sqlalchemy.orm import sessionmaker

import api.service.planning_service
from api.app import create_app
from api.client.planner_client import PlannerClient
from api.service.settings import Settings
from api.store import PlanRecord, Store
from api.store.repository import make_engine, utcnow

NOWHERE = "postgresql+psycopg://nobody:nothing@127.0.0.1:1/none"


class Outage:
    """Points a store at a database server that is not there (connections refused), and back."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.engine = store.engine

    def start(self) -> None:
        self.store.engine = make_engine(NOWHERE)
        self.store._session = sessionmaker(self.store.engine, expire_on_commit=False)

    def end(self) -> None:
        self.store.engine.dispose()
        self.store.engine = self.engine
        self.store._session = sessionmaker(self.engine, expire_on_commit=False)


def through(test_client: TestClient) -> httpx.MockTransport:
    """An httpx transport that hands each request to the app under test."""

    def handle(request: httpx.Request) -> httpx.Response:
        r = test_client.request(
            request.method,
            request.url.path,
            params=dict(request.url.params),
            content=request.content,
            headers=dict(request.headers),
        )
        return httpx.Response(r.status_code, headers=dict(r.headers), content=r.content)

    return httpx.MockTransport(handle)


@pytest.fixture
def app(tmp_path):
    return create_app(Settings(data_dir=tmp_path / "data", store_retry_s=20))


def test_a_store_that_does_not_answer_is_503_with_retry_after(app):
    with TestClient(app, raise_server_exceptions=False) as client:
        done = client.post("/v1/plans", json=small_request(n=6)).json()["id"]
        outage = Outage(app.state.store)
        outage.start()
        try:
            for r in (
                client.post("/v1/plans", json=small_request(n=6, seed=1)),
                client.post("/v1/plans", json={**small_request(n=6, seed=2), "wait": False}),
                client.get(f"/v1/plans/{done}"),
                client.get("/v1/plans"),
                client.get(f"/v1/plans/{done}/feedback"),
                client.post(f"/v1/plans/{done}/feedback", json={"measured_step_time_s": 1.0}),
            ):
                assert r.status_code == 503, r.text
                assert r.headers["retry-after"].isdigit() and r.headers["content-type"].startswith(
                    "application/problem+json"
                )
                assert r.json()["type"].endswith("/store-unavailable")
            assert client.get("/readyz").status_code == 503
        finally:
            outage.end()
        assert client.get(f"/v1/plans/{done}").status_code == 200


def test_the_client_retries_503_until_the_store_is_back(app):
    with TestClient(app, raise_server_exceptions=False) as http:
        outage = Outage(app.state.store)
        outage.start()
        sleeps: list[float] = []

        def sleep(seconds):
            sleeps.append(seconds)
            if len(sleeps) == 2:
                outage.end()

        planner = PlannerClient("http://testserver", transport=through(http), sleep=sleep, retries=4)
        req = small_request(n=6, seed=3)
        plan = planner.plan(req)
        assert plan["status"] == "done" and len(sleeps) == 2 and sleeps[0] >= 1.0  # the Retry-After of the 503
        assert_verified(plan, req)


def test_a_plan_solved_while_the_store_is_down_is_stored_when_it_comes_back(app, monkeypatch):
    real = api.service.planning_service.run_planner
    outage = Outage(app.state.store)

    def solve_during_an_outage(problem, deadline=None):
        outage.start()
        threading.Timer(1.0, outage.end).start()
        return real(problem, deadline=deadline)

    monkeypatch.setattr(api.service.planning_service, "run_planner", solve_during_an_outage)
    with TestClient(app, raise_server_exceptions=False) as client:
        req = {**small_request(n=6, seed=4), "wait": False}
        accepted = client.post("/v1/plans", json=req)
        assert accepted.status_code == 202, accepted.text
        deadline = time.monotonic() + 20
        while True:
            r = client.get(f"/v1/plans/{accepted.json()['id']}", params={"wait_ms": 1000})
            if r.status_code == 200 and r.json()["status"] != "pending" or time.monotonic() > deadline:
                break
        assert r.status_code == 200 and r.json()["status"] == "done", r.text
        assert_verified(r.json(), req)


def _pending(store: Store, req: dict, age_s: float) -> str:
    created = utcnow() - timedelta(seconds=age_s)
    plan_id = uuid.uuid4().hex
    store.add(
        PlanRecord(
            id=plan_id,
            created_at=created,
            status="pending",
            request_hash=uuid.uuid4().hex * 2,
            n_samples=len(req["batch"]["samples"]),
            n_ranks=16,
            cluster="c",
            model="m",
            request_json=json.dumps(req),
            claimed_at=created,
        )
    )
    return plan_id


def test_pending_plans_of_a_process_that_stopped_are_resumed_at_start(tmp_path):
    settings = Settings(data_dir=tmp_path / "data")
    store = Store(settings.sqlalchemy_url)
    create_app(settings)  # the schema
    req = small_request(n=6, seed=5)
    recent, old = (
        _pending(store, req, 1.0),
        _pending(store, small_request(n=5, seed=6), 10_000.0),
    )  # old: past the "lost" age
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        for plan_id in (recent, old):
            got = client.get(f"/v1/plans/{plan_id}", params={"wait_ms": 20_000}).json()
            assert got["status"] == "done", got
        assert_verified(client.get(f"/v1/plans/{recent}").json(), req)
    store.close()


def test_processes_starting_together_claim_each_pending_plan_once(tmp_path):
    settings = Settings(data_dir=tmp_path / "data")
    create_app(settings)
    store = Store(settings.sqlalchemy_url)
    ids = {_pending(store, small_request(n=4, seed=s), 5.0) for s in range(4)}
    start = utcnow()
    claims: list[list[str]] = []
    threads = [
        threading.Thread(target=lambda: claims.append([r.id for r in store.claim_pending(start)])) for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [i for c in claims for i in c]
    assert sorted(flat) == sorted(ids)  # each once
    assert store.claim_pending(start) == []
    store.close()


def test_the_first_answer_stored_wins(tmp_path):
    settings = Settings(data_dir=tmp_path / "data")
    create_app(settings)
    store = Store(settings.sqlalchemy_url)
    plan_id = _pending(store, small_request(n=4), 1.0)
    assert store.fail(plan_id, {"title": "lost"})
    assert not store.fail(plan_id, {"title": "again"})
    assert store.get(plan_id).error == {"title": "lost"}
    store.close()
