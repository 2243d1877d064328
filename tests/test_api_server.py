"""The service as a real uvicorn server on loopback (``dhp serve`` with two worker processes)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from api_support import ServerProcess, assert_verified, small_request

from api.client.planner_client import PlannerClient


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("served")


@pytest.fixture(scope="module")
def server(data_dir):
    srv = ServerProcess(data_dir, workers=2, env={"DHP_SOLVE_WORKERS": "2", "DHP_QUEUE_LIMIT": "8"})
    yield srv
    srv.stop()


def test_concurrent_requests_all_return_verified_plans(server):
    requests = [small_request(n=16, seed=s) for s in range(24)]
    with PlannerClient(server.url, retries=8, backoff_s=0.05) as client:
        with ThreadPoolExecutor(12) as pool:
            plans = list(pool.map(client.plan, requests))
    assert len({p["id"] for p in plans}) == len(requests)
    for req, plan in zip(requests, plans, strict=True):
        assert plan["status"] == "done"
        assert_verified(plan, req)


def test_plan_ahead_across_workers(server):
    with PlannerClient(server.url) as client:
        ids = [client.plan_ahead(small_request(n=12, seed=100 + s)) for s in range(6)]
        results = [client.result(i, wait_ms=20_000) for i in ids]
    assert [r["status"] for r in results] == ["done"] * 6
    for s, r in enumerate(results):
        assert_verified(r, small_request(n=12, seed=100 + s))


def test_metrics_add_up_over_worker_processes(server):
    for s in range(4):
        httpx.post(server.url + "/v1/plans", json=small_request(n=8, seed=200 + s), timeout=30).raise_for_status()
    text = httpx.get(server.url + "/metrics").text
    counts = [
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("dhp_solve_duration_seconds_count") and 'backend="heuristic"' in line
    ]
    assert counts and sum(counts) >= 4


def test_the_start_up_lines_name_addresses_that_open(server):
    """``dhp serve`` prints where the dashboard, the API docs, health and metrics are; each answers 200."""
    import re

    banner = server.log.read_text()
    addresses = re.findall(r"(http://127\.0\.0\.1:\d+/[a-z]+)(?=\s)", banner)
    paths = {address.rsplit("/", 1)[1] for address in addresses}
    assert {"dashboard", "docs", "healthz", "metrics"} <= paths, banner
    for address in addresses:
        assert httpx.get(address, follow_redirects=True).status_code == 200, address


def test_a_restarted_server_keeps_every_plan(server, data_dir):
    listing = httpx.get(server.url + "/v1/plans", params={"limit": 500}).json()
    before = {item["id"]: httpx.get(f"{server.url}/v1/plans/{item['id']}").json() for item in listing["items"]}
    assert len(before) == listing["total"] >= 24
    server.stop()
    again = ServerProcess(data_dir, workers=1)
    try:
        assert httpx.get(again.url + "/v1/plans").json()["total"] == len(before)
        for pid, doc in before.items():
            assert httpx.get(f"{again.url}/v1/plans/{pid}").json() == doc
    finally:
        again.stop()
