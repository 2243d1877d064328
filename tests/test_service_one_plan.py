"""One plan per batch: the cache key holds everything that changes the plan, and identical requests in
flight share one solve."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from api_support import small_request
from fastapi.testclient import TestClient

import api.service.planning_service
from api.app import create_app
from api.service import translate
from api.service.settings import Settings
from optimizer.problem.documents import problem_from_json


@pytest.fixture
def counted(monkeypatch):
    """The service's planner, counted and slowed down so that concurrent requests overlap."""
    calls: list[float] = []
    real = api.service.planning_service.run_planner
    lock = threading.Lock()

    def slow(problem, deadline=None):
        with lock:
            calls.append(time.perf_counter())
        time.sleep(0.4)
        return real(problem, deadline=deadline)

    monkeypatch.setattr(api.service.planning_service, "run_planner", slow)
    return calls


def test_request_hash_holds_the_existing_groups():
    req = small_request(n=8)
    other = {**req, "existing_groups": [[0, 1], [2, 3]]}
    hashes = {
        translate.request_hash(d, problem_from_json(d))
        for d in (req, other, {**req, "existing_groups": [[0, 1, 2, 3]]})
    }
    assert len(hashes) == 3


def test_other_existing_groups_get_their_own_plan(make_client):
    client = make_client()
    req = {**small_request(n=12, seed=2, group_reuse="only"), "existing_groups": [list(range(8)), list(range(8, 16))]}
    first = client.post("/v1/plans", json=req)
    assert first.status_code == 201, first.text
    allowed = {(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11), (12, 13, 14, 15)}
    other = {**req, "existing_groups": [list(g) for g in sorted(allowed)]}
    second = client.post("/v1/plans", json=other)
    assert second.status_code == 201, second.text
    assert second.json()["id"] != first.json()["id"]
    for mb in second.json()["micro_batches"]:
        for group in mb["groups"]:
            ranks = tuple(sorted(group["ranks"]))
            assert len(ranks) == 1 or ranks in allowed, ranks


def test_the_store_lookup_respects_existing_groups_across_restarts(tmp_path):
    req = {**small_request(n=12, seed=4, group_reuse="only"), "existing_groups": [list(range(8)), list(range(8, 16))]}
    with TestClient(create_app(Settings(data_dir=tmp_path / "d"))) as c:
        first = c.post("/v1/plans", json=req).json()["id"]
    with TestClient(create_app(Settings(data_dir=tmp_path / "d"))) as c:
        again = c.post("/v1/plans", json=req)
        assert again.status_code == 200 and again.json()["id"] == first
        other = c.post("/v1/plans", json={**req, "existing_groups": [list(range(4 * k, 4 * k + 4)) for k in range(4)]})
        assert other.status_code == 201 and other.json()["id"] != first


def _burst(client, body, n=16):
    barrier = threading.Barrier(n)

    def post(_):
        barrier.wait()
        return client.post("/v1/plans", json=body)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(post, range(n)))


def test_identical_concurrent_requests_share_one_solve(make_client, counted):
    client = make_client()  # 2 solve workers, 4 waiting: 16 separate solves would be refused
    req = small_request(n=16, seed=9)
    answers = _burst(client, req)
    assert [r.status_code for r in answers].count(201) == 1, [r.status_code for r in answers]
    assert {r.status_code for r in answers} == {200, 201}
    assert len({r.json()["id"] for r in answers}) == 1
    assert len({r.text.split('"created_at"')[1] for r in answers}) == 1  # the same plan document, byte for byte
    assert len(counted) == 1


def test_identical_concurrent_plan_ahead_requests_share_one_id(make_client, counted):
    client = make_client()
    req = {**small_request(n=16, seed=10), "wait": False}
    answers = _burst(client, req)
    assert {r.status_code for r in answers} == {202}, [r.text for r in answers if r.status_code != 202]
    ids = {r.json()["id"] for r in answers}
    assert len(ids) == 1
    done = client.get(f"/v1/plans/{ids.pop()}", params={"wait_ms": 20_000}).json()
    assert done["status"] == "done"
    assert len(counted) == 1


def test_a_plan_ahead_request_takes_the_plan_of_an_identical_one_being_solved(make_client, counted):
    client = make_client()
    req = small_request(n=16, seed=11)
    with ThreadPoolExecutor(1) as pool:
        now = pool.submit(client.post, "/v1/plans", json=req)
        while not counted:
            time.sleep(0.01)
        ahead = client.post("/v1/plans", json={**req, "wait": False, "options": {**req["options"]}, "cache": True})
        solved = now.result()
    assert solved.status_code == 201 and ahead.status_code in (200, 202)
    got = client.get(f"/v1/plans/{ahead.json()['id']}", params={"wait_ms": 20_000}).json()
    assert got["status"] == "done"
    assert got["micro_batches"] == solved.json()["micro_batches"]
    assert len(counted) == 1


def test_cache_false_solves_each_request(make_client, counted):
    client = make_client(solve_workers=4, queue_limit=4)
    answers = _burst(client, {**small_request(n=8, seed=12), "cache": False}, n=3)
    assert [r.status_code for r in answers] == [201] * 3
    assert len({r.json()["id"] for r in answers}) == 3
    assert len(counted) == 3


def test_plan_ahead_requests_behind_a_waiting_one_join_its_solve(make_client, counted):
    """One wait:true request, then seven identical wait:false ones 15 ms apart: one solve, one plan id, no 503."""
    client = make_client()
    req = small_request(n=16, seed=13)
    with ThreadPoolExecutor(8) as pool:
        now = pool.submit(client.post, "/v1/plans", json=req)
        while not counted:
            time.sleep(0.005)
        ahead = []
        for _ in range(7):
            ahead.append(pool.submit(client.post, "/v1/plans", json={**req, "wait": False}))
            time.sleep(0.015)
        solved, answers = now.result(), [f.result() for f in ahead]
    assert solved.status_code == 201, solved.text
    assert {r.status_code for r in answers} <= {200, 202}, [r.text for r in answers]
    assert {r.json()["id"] for r in answers} == {solved.json()["id"]}
    got = client.get(f"/v1/plans/{solved.json()['id']}").json()
    assert got["status"] == "done" and got["micro_batches"] == solved.json()["micro_batches"]
    assert len(counted) == 1


def test_waiting_requests_behind_a_plan_ahead_one_take_its_plan_without_a_worker(make_client, counted):
    """Requests identical to a plan-ahead one being solved wait on the event loop, not on solve workers: with one
    worker and one waiting place, three of them are answered with that plan instead of 503."""
    client = make_client(solve_workers=1, queue_limit=1)
    req = small_request(n=16, seed=14)
    ahead = client.post("/v1/plans", json={**req, "wait": False})
    assert ahead.status_code == 202
    while not counted:
        time.sleep(0.005)
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: client.post("/v1/plans", json=req), range(3)))
    assert [r.status_code for r in answers] == [200] * 3, [r.text for r in answers]
    assert {r.json()["id"] for r in answers} == {ahead.json()["id"]}
    assert len(counted) == 1


def test_existing_groups_in_another_order_share_the_plan(make_client, counted):
    client = make_client()
    groups = [list(range(8)), list(range(8, 16))]
    req = {**small_request(n=12, seed=15), "existing_groups": groups}
    first = client.post("/v1/plans", json=req)
    again = client.post("/v1/plans", json={**req, "existing_groups": [list(reversed(g)) for g in reversed(groups)]})
    assert first.status_code == 201 and again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert len(counted) == 1
