"""The trainer's clients, blocking and asyncio (each test runs on both): retries with backoff, Retry-After, errors
that name the field, one idempotency key per POST, the token from the environment, failed plans raising, feedback
kept while the service is down, local fallback; and both against a real server."""

from __future__ import annotations

import asyncio
import inspect
import json
import subprocess
import sys

import httpx
import pytest
from api_support import ROOT, ServerProcess, assert_verified, free_port, small_request

from api.client.planner_client import AsyncPlannerClient, PlannerClient, PlannerServiceError, ServiceUnavailable

CLIENTS = {"sync": PlannerClient, "async": AsyncPlannerClient}


@pytest.fixture(params=sorted(CLIENTS))
def kind(request):
    return request.param


def call(value):
    """The value of a client call: awaited when the client is the asyncio one."""
    return asyncio.run(value) if inspect.isawaitable(value) else value


def new_client(kind, url="http://planner.test", handler=None, **kwargs):
    if handler is not None:
        kwargs["transport"] = httpx.MockTransport(handler)
    return CLIENTS[kind](url, **kwargs)


def mock_client(handler, kind="sync", **kwargs):
    sleeps = []

    async def pause(seconds):
        sleeps.append(seconds)

    client = new_client(kind, handler=handler, sleep=pause if kind == "async" else sleeps.append, **kwargs)
    return client, sleeps


def test_retries_with_backoff_then_succeeds(kind):
    calls = []

    def handler(request):
        calls.append(request)
        if len(calls) < 3:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(201, json={"id": "abc", "status": "done"})

    client, sleeps = mock_client(handler, kind, retries=4, backoff_s=0.1)
    assert call(client.plan(small_request(n=2)))["id"] == "abc"
    assert len(calls) == 3 and len(sleeps) == 2
    assert 0.05 <= sleeps[0] <= 0.1 and 0.1 <= sleeps[1] <= 0.2  # exponential, with jitter


def test_honours_retry_after_on_503(kind):
    answers = [
        httpx.Response(503, headers={"Retry-After": "1"}, json={"title": "busy"}),
        httpx.Response(201, json={"id": "x", "status": "done"}),
    ]
    client, sleeps = mock_client(lambda request: answers.pop(0), kind)
    assert call(client.plan(small_request(n=2)))["id"] == "x"
    assert sleeps == [1.0]


def test_request_errors_are_not_retried_and_name_the_field(kind):
    calls = []

    def handler(request):
        calls.append(request)
        return httpx.Response(
            422,
            json={
                "title": "Invalid planning request",
                "detail": "must be >= 0",
                "field": "batch.samples[0].text_tokens",
                "hint": "give the number of text tokens.",
            },
        )

    client, _ = mock_client(handler, kind)
    with pytest.raises(PlannerServiceError) as info:
        call(client.plan(small_request(n=2)))
    assert len(calls) == 1
    assert info.value.status == 422 and info.value.field == "batch.samples[0].text_tokens"
    assert "To fix: give the number of text tokens." in str(info.value)


def test_token_is_sent(kind):
    seen = []

    def handler(request):
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"clusters": {}})

    call(new_client(kind, handler=handler, token="secret-token").presets())
    assert seen == ["Bearer secret-token"]


def test_unreachable_without_fallback_raises(kind):
    client = new_client(kind, f"http://127.0.0.1:{free_port()}", retries=1, backoff_s=0.001)
    with pytest.raises(ServiceUnavailable):
        call(client.plan(small_request(n=2)))
    assert not call(client.healthy())


def test_unreachable_with_fallback_plans_locally(kind):
    client = new_client(kind, f"http://127.0.0.1:{free_port()}", retries=1, backoff_s=0.001, local_fallback=True)
    req = small_request(n=12, backend="auto")
    plan = call(client.plan(req))
    assert plan["status"] == "local" and plan["id"].startswith("local-")
    assert plan["solver"]["backend"] == "heuristic"
    assert_verified(plan, req)
    ahead = call(client.plan_ahead(small_request(n=6, seed=1)))
    later = call(client.result(ahead))
    assert later["status"] == "local"
    assert_verified(later, small_request(n=6, seed=1))
    assert call(client.feedback(plan["id"], 1.0)) is None
    assert client.fallbacks == 2


def test_against_a_real_server(tmp_path):
    server = ServerProcess(tmp_path)
    try:
        with PlannerClient(server.url, local_fallback=True) as client:
            req = small_request(n=10)
            plan = client.plan(req)
            assert plan["status"] == "done" and not plan["id"].startswith("local-")
            assert_verified(plan, req)
            ahead = client.plan_ahead(small_request(n=10, seed=4))
            assert client.result(ahead, wait_ms=20_000)["status"] == "done"
            shape = [[0.1] * len(mb["groups"]) for mb in plan["micro_batches"]]
            fb = client.feedback(plan["id"], 1.25, group_times_s=shape, step=3)
            assert fb["measured_step_time_s"] == 1.25 and fb["predicted_step_time_s"] == pytest.approx(
                plan["predicted_step_time_s"]
            )
            with pytest.raises(PlannerServiceError) as info:
                client.plan({**req, "cluster": {"nodes": -1}})
            assert info.value.field == "cluster.nodes"
            assert client.fallbacks == 0
    finally:
        server.stop()


def test_importable_without_the_web_stack():
    code = (
        "import sys\n"
        "for m in ('fastapi', 'starlette', 'sqlalchemy', 'pydantic', 'pydantic_settings', 'uvicorn', 'alembic', "
        "'prometheus_client'):\n"
        "    sys.modules[m] = None\n"
        "from api.client.planner_client import AsyncPlannerClient, PlannerClient\n"
        "print(PlannerClient.__name__, AsyncPlannerClient.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "PlannerClient AsyncPlannerClient"


def test_a_failed_plan_ahead_raises_from_result(kind):
    error = {
        "type": "https://dhp-planner.dev/problems/infeasible",
        "title": "No plan satisfies the request",
        "status": 422,
        "detail": "sample 'x' does not fit",
        "field": "batch.samples",
        "hint": "use more ranks.",
    }

    def handler(request):
        if request.method == "POST":
            return httpx.Response(202, json={"id": "p1", "status": "pending"})
        return httpx.Response(200, json={"id": "p1", "status": "failed", "error": error})

    client, _ = mock_client(handler, kind)
    plan_id = call(client.plan_ahead(small_request(n=2)))
    with pytest.raises(PlannerServiceError) as info:
        call(client.result(plan_id))
    assert info.value.status == 422 and info.value.field == "batch.samples"


def test_token_from_the_environment(kind, monkeypatch):
    seen = []

    def handler(request):
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={})

    monkeypatch.setenv("DHP_TOKEN", "token-from-env-0123")
    call(new_client(kind, handler=handler).presets())
    call(new_client(kind, handler=handler, token="given-token-0123").presets())
    assert seen == ["Bearer token-from-env-0123", "Bearer given-token-0123"]


def test_retried_posts_carry_one_idempotency_key(kind):
    keys = []

    def handler(request):
        keys.append(request.headers.get("idempotency-key"))
        if len(keys) in (1, 2):
            return httpx.Response(503, headers={"Retry-After": "1"}, json={"title": "busy"})
        return httpx.Response(201, json={"id": "x", "status": "done"})

    client, _ = mock_client(handler, kind)
    call(client.plan(small_request(n=2)))
    call(client.plan(small_request(n=2)))
    assert len(keys) == 4 and keys[0] and keys[0] == keys[1] == keys[2] and keys[3] != keys[0]


def test_feedback_is_kept_while_the_service_is_down_and_sent_later(kind):
    up = [False]
    delivered = []

    def handler(request):
        if not up[0]:
            raise httpx.ConnectError("refused", request=request)
        delivered.append((request.url.path, request.read()))
        return httpx.Response(201, json={"id": len(delivered)})

    client, _ = mock_client(handler, kind, retries=1, local_fallback=True)
    assert call(client.feedback("p1", 1.5, step=1)) is None
    assert call(client.feedback("p2", 1.6, step=2)) is None
    assert len(client.unsent_feedback) == 2
    up[0] = True
    assert call(client.feedback("p3", 1.7, step=3)) == {"id": 3}
    assert [path for path, _ in delivered] == [
        "/v1/plans/p1/feedback",
        "/v1/plans/p2/feedback",
        "/v1/plans/p3/feedback",
    ]
    assert not client.unsent_feedback


def test_the_local_fallback_is_deterministic(kind, monkeypatch):
    import planning.planner

    seen = []
    real = planning.planner.plan

    def spy(problem, *args, **kwargs):
        seen.append(problem.options.deterministic)
        return real(problem, *args, **kwargs)

    monkeypatch.setattr(planning.planner, "plan", spy)
    client = new_client(kind, f"http://127.0.0.1:{free_port()}", retries=0, local_fallback=True)
    req = small_request(n=40, time_budget_ms=30)
    plans = [call(client.plan(req)) for _ in range(2)]
    assert seen == [True, True]
    assert plans[0]["micro_batches"] == plans[1]["micro_batches"]


def test_async_client_against_a_real_server(tmp_path):
    async def session(url):
        async with AsyncPlannerClient(url, local_fallback=True) as client:
            req = small_request(n=10, seed=2)
            plans = await asyncio.gather(
                *(client.plan(small_request(n=10, seed=s)) for s in (2, 3))
            )  # concurrent calls share the client
            plan = plans[0]
            assert plan["status"] == "done" and not plan["id"].startswith("local-")
            assert_verified(plan, req)
            ahead = await client.plan_ahead(small_request(n=10, seed=5))
            assert (await client.result(ahead, wait_ms=20_000))["status"] == "done"
            shape = [[0.1] * len(mb["groups"]) for mb in plan["micro_batches"]]
            fb = await client.feedback(plan["id"], 1.25, group_times_s=shape, step=3)
            assert fb["measured_step_time_s"] == 1.25 and fb["predicted_step_time_s"] == pytest.approx(
                plan["predicted_step_time_s"]
            )
            with pytest.raises(PlannerServiceError) as info:
                await client.plan({**req, "cluster": {"nodes": -1}})
            assert info.value.field == "cluster.nodes"
            assert await client.healthy() and client.fallbacks == 0

    server = ServerProcess(tmp_path)
    try:
        asyncio.run(session(server.url))
    finally:
        server.stop()


WARM_SCRIPT = r"""
import json, sys, time
import httpx
sys.path.insert(0, "tests")
from api_support import small_request
from api.client import PlannerClient
import planning.warm as warm

def down(request):
    raise httpx.ConnectError("refused", request=request)

plain = PlannerClient("http://planner", transport=httpx.MockTransport(down), retries=0)
client = PlannerClient("http://planner", transport=httpx.MockTransport(down), retries=0, local_fallback=True)
started = client.warm_thread is not None and client.warm_thread.name == "dhp-engine-warm-up"
plan = client.plan(small_request(n=12))  # waits for what is left of the warm-up
client.warm_thread.join(60)
print(json.dumps({"plain": plain.warm_thread is None, "started": started, "warmed": warm.ended(),
                  "error": client.warm_error, "status": plan["status"], "alive": client.warm_thread.is_alive()}))
"""


def test_a_fallback_client_warms_the_engine_in_the_background_and_plans_after_it():
    out = subprocess.run([sys.executable, "-c", WARM_SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {
        "plain": True,
        "started": True,
        "warmed": True,
        "error": None,
        "status": "local",
        "alive": False,
    }


def test_without_the_engine_the_warm_up_thread_ends_quietly():
    code = (
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('numpy', 'numba'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from api.client import PlannerClient\n"
        "client = PlannerClient('http://planner', local_fallback=True)\n"
        "client.warm_thread.join(60)\n"
        "print(client.warm_error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout.strip() == "the engine is not installed (numpy is missing)"


def test_plan_ahead_asks_for_auto_with_the_step_time_it_measured(kind, monkeypatch):
    from types import SimpleNamespace

    from api.client import client_core

    sent = []

    def handler(request):
        body = json.loads(request.read())
        if request.url.path == "/v1/plans":
            sent.append(body["options"])
        return httpx.Response(202, json={"id": f"p{len(sent)}", "status": "pending"})

    now = [100.0]
    monkeypatch.setattr(client_core, "time", SimpleNamespace(monotonic=lambda: now[0]))
    client, _ = mock_client(handler, kind)
    request = {k: v for k, v in small_request(n=2).items() if k != "options"}
    call(client.plan_ahead(request))  # the first step: nothing measured yet
    now[0] += 1.8372
    call(client.plan_ahead(request))  # 1.837 s after the first call: one step
    call(client.feedback("p2", 2.4))  # the trainer's own figure for the step that followed
    now[0] += 1.0
    call(client.plan_ahead(request))
    call(client.plan_ahead({**request, "options": {"time_budget_ms": 300}}))  # a budget of its own stays
    call(client.plan_ahead({**request, "options": {"time_budget_ms": "auto", "previous_step_s": 5.0}}))
    assert sent == [
        {"time_budget_ms": "auto"},
        {"time_budget_ms": "auto", "previous_step_s": 1.837},
        {"time_budget_ms": "auto", "previous_step_s": 2.4},
        {"time_budget_ms": 300},
        {"time_budget_ms": "auto", "previous_step_s": 5.0},
    ]
    assert request == {k: v for k, v in small_request(n=2).items() if k != "options"}  # the caller's is not changed
