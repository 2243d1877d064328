"""Request bodies: parsed off the event loop in steps (the same values and errors as json.loads), held within a byte
budget (503 with Retry-After beyond it, before the body is read), and taken apart off the event loop afterwards."""

from __future__ import annotations

import gc
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from api_support import small_request
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

import api.service.intake as intake
import api.service.planning_service
from api.app import create_app
from api.service.intake import BodyBudget, Keeper, loads, parse_body
from api.service.settings import Settings

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(JSON, st.sampled_from([None, 0, 2]))
def test_stepwise_parse_gives_what_json_loads_gives(value, indent):
    text = json.dumps(value, indent=indent)
    assert loads(text.encode()) == json.loads(text) == value


@pytest.mark.parametrize(
    "bad",
    [
        b'{"a": 1,}',
        b'{"a" 1}',
        b"[1, 2",
        b'{"a": [1, 2,]}',
        b"",
        b" ",
        b'{"a": 1} x',
        b"[1 2]",
        b'{"a":1 "b":2}',
        b"{",
        b"[",
        b'{"a":',
        b'{"batch": {"samples": [{"id": "a"},, ]}}',
    ],
)
def test_stepwise_parse_fails_where_and_as_json_loads_fails(bad):
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(bad)
    with pytest.raises(json.JSONDecodeError) as got:
        loads(bad)
    assert (got.value.msg, got.value.pos) == (expected.value.msg, expected.value.pos)


def test_a_large_body_is_parsed_on_a_parse_thread_and_answers_as_before(tmp_path, monkeypatch):
    threads = []
    real = intake.parse_body

    def spy(data):
        threads.append(threading.current_thread().name)
        return real(data)

    monkeypatch.setattr(intake, "parse_body", spy)
    monkeypatch.setattr(intake, "INLINE_BYTES", 256)
    with TestClient(create_app(Settings(data_dir=tmp_path / "data"))) as client:
        req = small_request(n=8, seed=3)
        r = client.post("/v1/plans", json=req)
        assert r.status_code == 201, r.text
        again = client.post(
            "/v1/plans", json=dict(reversed(list(req.items())))
        )  # same request, other key order: the cache
        assert again.status_code == 200 and again.json()["id"] == r.json()["id"]
        bad = client.post(
            "/v1/plans", content=json.dumps(req).encode()[:-2], headers={"content-type": "application/json"}
        )
        assert bad.status_code == 422 and bad.json()["type"].endswith("/invalid-request")
        assert "JSON decode error" in bad.json()["detail"]
    assert len(threads) == 3 and all(name.startswith("dhp-parse") for name in threads)


def test_bodies_beyond_the_byte_budget_are_refused_before_they_are_read(tmp_path, monkeypatch):
    started = threading.Event()
    real = api.service.planning_service.run_planner

    def slow(problem, deadline=None):
        started.set()
        time.sleep(1.0)
        return real(problem, deadline=deadline)

    monkeypatch.setattr(api.service.planning_service, "run_planner", slow)
    with TestClient(
        create_app(Settings(data_dir=tmp_path / "data", max_body_bytes_in_flight=1024)), raise_server_exceptions=False
    ) as client:
        big = small_request(n=12, seed=5)
        assert len(json.dumps(big)) > 1024  # alone it is taken (nothing else is held), but no second one beside it
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(client.post, "/v1/plans", json=big)
            assert started.wait(10)
            # Not JSON: had it been read and parsed, the answer would be 422.
            r = client.post("/v1/plans", content=b"{" + b" " * 2000, headers={"content-type": "application/json"})
            assert first.result().status_code == 201
        assert r.status_code == 503 and r.headers["retry-after"].isdigit()
        assert "DHP_MAX_BODY_BYTES_IN_FLIGHT" in r.json()["detail"]
        assert client.post("/v1/plans", json=small_request(n=12, seed=6)).status_code == 201  # given back once answered


def test_body_budget_takes_one_body_beyond_it_only_alone():
    budget = BodyBudget(100)
    assert budget.take(300)  # nothing else held
    assert not budget.take(1)
    budget.give(300)
    assert budget.take(60) and budget.take(40) and not budget.take(1)
    budget.give(100)
    assert budget.used == 0


def test_keeper_takes_apart_only_what_nothing_else_refers_to_and_resumes_the_collector():
    give_up = time.monotonic() + 10
    while (
        len(intake.KEEPER) and time.monotonic() < give_up
    ):  # documents of earlier tests hold pauses of the collector too
        time.sleep(0.05)
    keeper = Keeper(every_s=3600)
    doc, pause = parse_body(
        json.dumps(
            {"batch": {"samples": [{"id": str(k), "videos": [{"frames": k + 1}]} for k in range(2000)]}, "x": [1, 2]}
        ).encode()
    )
    assert not gc.isenabled()  # paused while the parsed document lives
    shared = doc["batch"]["samples"]
    keeper.keep(doc, pause)
    del doc
    assert keeper.sweep() == 1 and len(keeper) == 0
    assert gc.isenabled()
    assert len(shared) == 2000 and shared[5] == {"id": "5", "videos": [{"frames": 6}]}  # still referred to: left whole

    held = {"a": [1]}
    keeper.keep(held)
    assert keeper.sweep() == 0 and len(keeper) == 1  # referred to here: kept
    del held
    assert keeper.sweep() == 1


JSON64 = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=40,
)


@settings(max_examples=200, deadline=None)
@given(JSON64)
def test_documents_encoded_in_pieces_are_the_bytes_of_one_call(value):
    import hashlib

    import orjson

    from api.service import translate

    long = {
        "batch": {"samples": [value] * (translate.PIECE_ITEMS * 2 + 3), "other": [[value]]}
    }  # long lists go in pieces of elements
    for doc in (value, long):
        assert translate._dumps(doc, samples=translate.STEPWISE_SAMPLES + 1) == orjson.dumps(doc).decode()
        if isinstance(doc, dict):
            assert translate.raw_hash(doc) == hashlib.sha256(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()
