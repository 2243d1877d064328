"""/v1/jobs: an epoch planned by the service in the background, its progress, its plans in the plan
store, the same plan file as the command line, cancel and resume, bad input."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("pyarrow")

from fastapi.testclient import TestClient  # noqa: E402

from api.app import create_app  # noqa: E402
from api.service.settings import Settings  # noqa: E402
from jobs.engines import LocalEngine  # noqa: E402
from jobs.runner import run_job  # noqa: E402
from jobs.spec import job_from_json  # noqa: E402
from jobs.steps import build_epoch  # noqa: E402
from jobs.synthetic import synthetic_samples  # noqa: E402

CLUSTER = {"cluster": {"nodes": 2, "gpus_per_node": 8}, "model_preset": "llama3-8b"}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("jobs-api")))
    with TestClient(app) as c:
        yield c


def _wait(client, job_id, until=("done",), timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = client.get(f"/v1/jobs/{job_id}").json()
        if state["status"] in until:
            return state
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} still {state['status']}")


def test_job_plans_the_epoch_into_the_store_and_a_plan_file(client, tmp_path):
    samples = synthetic_samples(["long-text"], 100, seed=4)
    samples[42]["text_tokens"] = 30_000_000  # too long for 16 ranks
    body = {
        "dataset": {"samples": samples},
        "global_batch_size": 10,
        "sampler": {"kind": "shuffle", "seed": 2},
        **CLUSTER,
    }
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["status"] == "running" and job["total"] == 10 and job["done"] == 0
    state = _wait(client, job["id"])
    assert state["done"] == 10 and state["failed"] == 1 and state["eta_s"] == 0.0 and state["summary"]["planned"] == 9
    failure = state["summary"]["failures"][0]
    assert failure["sample"] == samples[42]["id"] and failure["kind"] == "infeasible"
    # every step's plan (or its error) is in the plan store under the job's id
    for step in range(10):
        plan = client.get(f"/v1/plans/{job['id']}-{step:06d}").json()
        if step == failure["step"]:
            assert (
                plan["status"] == "failed"
                and plan["error"]["sample"] == samples[42]["id"]
                and plan["error"]["status"] == 422
            )
        else:
            assert plan["status"] == "done" and plan["micro_batches"] and plan["predicted_step_time_s"] > 0
    # the service's plan file is the command line's, byte for byte
    served = client.get(f"/v1/jobs/{job['id']}/plan-file")
    assert served.status_code == 200 and served.headers["content-type"] == "application/vnd.apache.parquet"
    local = run_job(build_epoch(job_from_json(body)), tmp_path, LocalEngine(1))
    assert served.content == (tmp_path / "plan.parquet").read_bytes() and local.index["summary"]["failed"] == 1


def test_cancel_then_resume(client):
    samples = synthetic_samples(["video"], 60 * 16, seed=9)
    body = {
        "dataset": {"samples": samples},
        "global_batch_size": 16,
        "cluster": {"nodes": 8, "gpus_per_node": 8},
        "model_preset": "qwen2-vl-7b",
    }
    job = client.post("/v1/jobs", json=body).json()
    _wait(client, job["id"], until=("running",))
    deadline = time.monotonic() + 30
    while client.get(f"/v1/jobs/{job['id']}").json()["done"] < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    stopped = _wait(client, job["id"], until=("cancelled", "done"))
    assert stopped["status"] == "cancelled" and 2 <= stopped["done"] < 60
    assert client.get(f"/v1/jobs/{job['id']}/plan-file").status_code == 409
    assert client.get(f"/v1/plans/{job['id']}-{stopped['done'] - 1:06d}").json()["status"] == "done"
    resumed = client.post(f"/v1/jobs/{job['id']}/resume")
    assert resumed.status_code == 202 and resumed.json()["status"] == "running"
    done = _wait(client, job["id"])
    assert done["done"] == 60 and done["failed"] == 0


@pytest.mark.parametrize(
    "body, field",
    [
        ({"dataset": {"path": "/etc/hosts"}, "global_batch_size": 4}, "dataset.path"),
        ({"dataset": {"samples": [{"id": "a", "text_tokens": 3}]}}, "global_batch_size"),
        (
            {
                "dataset": {"samples": [{"id": "a", "text_tokens": 3}]},
                "global_batch_size": 1,
                "sampler": {"kind": "zigzag"},
            },
            "sampler.kind",
        ),
        (
            {
                "dataset": {"samples": [{"id": "a", "text_tokens": 3}]},
                "global_batch_size": 1,
                "options": {"time_budget_ms": 10**6},
            },
            "options.time_budget_ms",
        ),
        (
            {"dataset": {"samples": [{"id": "a", "text_tokens": 3}]}, "global_batch_size": 1, "workers": 10**4},
            "workers",
        ),
    ],
)
def test_bad_job_is_422_naming_the_field(client, body, field):
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    assert r.json()["field"] == field


def test_unknown_job_is_404(client):
    for method, path in (
        ("get", "/v1/jobs/nope"),
        ("post", "/v1/jobs/nope/cancel"),
        ("post", "/v1/jobs/nope/resume"),
        ("get", "/v1/jobs/nope/plan-file"),
    ):
        r = getattr(client, method)(path)
        assert r.status_code == 404 and r.json()["field"] == "job_id"
