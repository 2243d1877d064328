"""/v1/profiles: a profile refitted from the group times posted as feedback, stored as a version of its key,
read back with its provenance, and planned with as ``"profile": "learned:NAME"``."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from api_support import small_request
from test_api import assert_problem

from bench.refit_check import measure, shifted
from jobs.synthetic import synthetic_samples
from optimizer.problem.documents import problem_from_json

WORKLOADS = ("video", "mixed", "long-text")


@pytest.fixture
def client(make_client):
    return make_client()


def run_steps(client, truth, seeds, profile=None, noise=0.01):
    """Plan each batch through the service and post what it took under ``truth`` as feedback; the plan ids."""
    rng = np.random.default_rng(seeds[0])
    ids = []
    for seed in seeds:
        req = small_request(n=24, seed=seed, workload=WORKLOADS[seed % 3], nodes=2)
        if profile is not None:
            req["profile"] = profile
        r = client.post("/v1/plans", json=req)
        assert r.status_code == 201, r.text
        plan = r.json()
        local = {k: v for k, v in req.items() if k != "profile"}
        times, step = measure(problem_from_json(local), plan, truth, rng, noise)
        sent = {"measured_step_time_s": step, "group_times_s": times}
        fb = client.post(f"/v1/plans/{plan['id']}/feedback", json=sent)
        assert fb.status_code == 201, fb.text
        ids.append(plan["id"])
    return ids


def test_refit_from_feedback_is_stored_read_back_and_planned_with(client):
    base = problem_from_json(small_request(nodes=2)).cost_profile
    truth = shifted(base, seed=3)
    ids = run_steps(client, truth, list(range(15)))

    r = client.post("/v1/profiles/fit", json={"plan_ids": ids})
    assert r.status_code == 201, r.text
    learned = r.json()
    name = learned["name"]
    assert name.endswith(".v1") and learned["reference"] == f"learned:{name}" and learned["version"] == 1
    assert learned["base_profile"] == "analytical" and learned["model"] == "qwen2-vl-7b"
    assert learned["profile"]["source"].startswith(f"learned:{name} (refit over ")
    fit = learned["fit"]
    before, after = fit["held_out"]["before"], fit["held_out"]["after"]
    assert after["micro_batches"]["mean"] < 0.05 < before["micro_batches"]["mean"]
    assert len(learned["sources"]["steps"]) == 15 and learned["sources"]["held_out"]
    assert {s["plan_id"] for s in learned["sources"]["steps"]} == set(ids)

    got = client.get(f"/v1/profiles/{name}")
    assert got.status_code == 200 and got.json() == learned
    assert client.get(f"/v1/profiles/{learned['key']}").json()["name"] == name  # the key: its newest version
    assert [p["name"] for p in client.get("/v1/profiles").json()] == [name]

    # Plans made with the learned profile predict what the truth measures; the analytical default did not.
    new_ids = run_steps(client, truth, list(range(100, 106)), profile=f"learned:{name}", noise=0.0)
    for pid in new_ids:
        plan = client.get(f"/v1/plans/{pid}").json()
        fb = client.get(f"/v1/plans/{pid}/feedback").json()[0]
        assert plan["predicted_step_time_s"] == pytest.approx(fb["measured_step_time_s"], rel=0.05)
    listed = client.get("/v1/plans", params={"limit": 1}).json()["items"][0]
    assert listed["profile"].startswith(f"learned:{name} ")

    # An epoch job plans its steps with it too.
    job = {
        "dataset": {"samples": synthetic_samples(["mixed"], 16, seed=1)},
        "global_batch_size": 8,
        "cluster": {"nodes": 2, "gpus_per_node": 8},
        "model_preset": "qwen2-vl-7b",
        "profile": f"learned:{name}",
    }
    r = client.post("/v1/jobs", json=job)
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 60
    while client.get(f"/v1/jobs/{r.json()['id']}").json()["status"] != "done":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    step0 = client.get(f"/v1/plans/{r.json()['id']}-000000").json()
    assert step0["status"] == "done"
    assert client.get("/v1/plans", params={"limit": 1}).json()["items"][0]["profile"].startswith(f"learned:{name} ")
    assert_problem(client.post("/v1/jobs", json={**job, "profile": "learned:nope"}), 422, "profile")

    # Refitting the steps planned with it makes the next version of the same key.
    again = client.post("/v1/profiles/fit", json={"cluster": learned["cluster"], "model": "qwen2-vl-7b", "min_r2": 0.5})
    assert again.status_code == 201, again.text
    assert again.json()["key"] == learned["key"] and again.json()["version"] == 2
    assert again.json()["base_profile"].startswith(f"learned:{name} ")


def test_fit_and_learned_profile_errors_name_the_field(client):
    assert_problem(client.post("/v1/profiles/fit", json={}), 422, "plan_ids")
    assert_problem(client.post("/v1/profiles/fit", json={"plan_ids": ["0" * 32]}), 422, "plan_ids")
    assert_problem(client.post("/v1/profiles/fit", json={"cluster": "x", "model": "y"}), 422, "cluster")
    assert_problem(client.post("/v1/profiles/fit", json={"plan_ids": ["a"], "latest": 3}), 422, "plan_ids")
    r = client.post("/v1/plans", json=small_request(n=8, nodes=2))
    plan = r.json()
    shape = [[1.0] * len(mb["groups"]) for mb in plan["micro_batches"]]
    client.post(f"/v1/plans/{plan['id']}/feedback", json={"measured_step_time_s": 1.0, "group_times_s": shape})
    body = assert_problem(client.post("/v1/profiles/fit", json={"plan_ids": [plan["id"]]}), 422, "plan_ids")
    assert "too few" in body["detail"]
    assert_problem(client.get("/v1/profiles/nope.v1"), 404, "name")
    req = small_request(n=8, nodes=2)
    req["profile"] = "learned:nope.v1"
    body = assert_problem(client.post("/v1/plans", json=req), 422, "profile")
    assert "GET /v1/profiles" in body["hint"]
    req["profile"] = "analytical please"
    assert_problem(client.post("/v1/plans", json=req), 422, "profile")


def test_automatic_refit_is_off_by_default_and_logged_when_on(make_client, caplog):
    base = problem_from_json(small_request(nodes=2)).cost_profile
    off = make_client()
    run_steps(off, shifted(base, seed=5), list(range(8)))
    assert off.get("/v1/profiles").json() == []

    on = make_client(refit_every=4, refit_error=0.05)  # the same store: its 8 steps count, the next 4 decide
    with caplog.at_level(logging.INFO, logger="dhp.profiles"):
        run_steps(on, base, list(range(40, 44)), noise=0.0)  # the profile is right: within the threshold
        assert any("within 5.0%; not refitted" in r.getMessage() for r in caplog.records)
        run_steps(on, shifted(base, seed=5), list(range(20, 32)))
        deadline = time.monotonic() + 60
        while not any("; stored " in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
            time.sleep(0.1)
    stored = on.get("/v1/profiles").json()[-1]
    assert stored["base_profile"] == "analytical" and stored["version"] == 1
    assert any(f"; stored {stored['name']} " in r.getMessage() for r in caplog.records)
