"""A planning service filled the way the dashboard's users fill it: `dhp bench`-style plans (seeded workloads of
bench's generators on the 64-rank H100 preset, several backends, budgets and profiles, and one on the mixed
H100/A100 preset) posted through the API, an epoch job of a few steps (POST /v1/jobs), and synthetic trainer
feedback on the plans: measured = predicted x a per-profile bias x seeded noise (the bias of the FlexSP-fitted
profile is set above the re-profiling threshold on purpose, so the calibration view has something to flag)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from optimizer.costs.zoo import load_profile
from optimizer.problem.workloads import WORKLOADS

BIAS = {"analytical": 1.03, "flexsp-gpt7b": 1.16, "stress-mixed-gpu": 1.09}
"""Measured over predicted, in the mean, of the synthetic feedback by profile."""

# (workload, seed, samples, backend, budget ms, profile preset or None)
PLANS: list[tuple[str, int, int, str, float, str | None]] = [
    ("video", 0, 256, "heuristic", 200, None),
    ("video", 1, 256, "highs", 250, None),
    ("long-text", 0, 192, "heuristic", 100, None),
    ("mixed", 0, 256, "auto", 300, None),
    ("image-sft", 0, 256, "heuristic", 200, None),
    ("anyres", 0, 128, "heuristic", 50, None),
    ("video", 2, 192, "heuristic", 200, "flexsp-gpt7b"),
    ("mixed", 1, 192, "highs", 250, "flexsp-gpt7b"),
    ("long-text", 1, 128, "heuristic", 200, "flexsp-gpt7b"),
]
MIXED = ("mixed", 2, 128, "auto", 200, "stress-mixed-gpu", "mixed-h100-a100")
"""The plan on a cluster of two GPU types (H100 nodes 0-1, A100 nodes 2-3), with the profile made for it."""
JOB_STEPS = 3
"""Steps of the epoch job: its plans are stored as ``<job id>-<step>``."""


def job_request(steps: int = JOB_STEPS) -> dict[str, Any]:
    """An epoch job of ``steps`` steps of 32 long-text samples on the 64-rank H100 preset."""
    return {
        "dataset": WORKLOADS["long-text"](32 * steps, seed=3),
        "global_batch_size": 32,
        "cluster_preset": "h100-8x8",
        "model_preset": "qwen2-vl-7b",
        "options": {"backend": "heuristic", "time_budget_ms": 100},
    }


def request(
    workload: str,
    seed: int,
    n: int,
    backend: str,
    budget_ms: float,
    profile: str | None,
    cluster_preset: str = "h100-8x8",
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "batch": WORKLOADS[workload](n, seed=seed),
        "cluster_preset": cluster_preset,
        "model_preset": "qwen2-vl-7b",
        "options": {"backend": backend, "time_budget_ms": budget_ms},
    }
    if profile:
        doc["profile"] = load_profile(profile)
    return doc


@dataclass
class Filled:
    plans: list[dict[str, Any]] = field(default_factory=list)
    """The plans posted (the mixed-cluster one last), each with feedback."""
    profile_of: dict[str, str] = field(default_factory=dict)
    asked_of: dict[str, str] = field(default_factory=dict)
    """The backend each plan's request asked for."""
    job_steps: list[str] = field(default_factory=list)
    """Ids of the epoch job's step plans (no feedback)."""
    feedback: int = 0

    @property
    def mixed(self) -> dict[str, Any]:
        """The plan on the mixed H100/A100 cluster."""
        return self.plans[len(PLANS)]


def fill(url: str, headers: dict[str, str] | None = None, steps: int = 3, seed: int = 0) -> Filled:
    """Post the plans, ``steps`` feedback documents per plan (each plan's first step also carries per-group times),
    and the epoch job (waiting for it to finish)."""
    out = Filled()
    with httpx.Client(base_url=url, headers=headers or {}, timeout=60) as client:
        for spec in [*PLANS, MIXED]:
            r = client.post("/v1/plans", json=request(*spec))
            r.raise_for_status()
            plan = r.json()
            out.plans.append(plan)
            out.profile_of[plan["id"]] = spec[5] or "analytical"
            out.asked_of[plan["id"]] = spec[3]
        job = client.post("/v1/jobs", json=job_request())
        job.raise_for_status()
        out.job_steps = _finished_job(client, job.json()["id"])
        for k, plan in enumerate(out.plans):
            # The plan's own draws, its step times apart from its group times: the step times are the same whatever
            # the plans solved within their budgets look like.
            rng, group_rng = random.Random(f"{seed}-{k}-steps"), random.Random(f"{seed}-{k}-groups")
            bias = BIAS[out.profile_of[plan["id"]]]
            for step in range(steps):
                body: dict[str, Any] = {
                    "measured_step_time_s": plan["predicted_step_time_s"] * bias * (1 + rng.gauss(0, 0.025)),
                    "step": 100 * k + step,
                }
                if step == 0:
                    body["group_times_s"] = [
                        [g["predicted_time_s"] * bias * (1 + group_rng.gauss(0, 0.03)) for g in mb["groups"]]
                        for mb in plan["micro_batches"]
                    ]
                client.post(f"/v1/plans/{plan['id']}/feedback", json=body).raise_for_status()
                out.feedback += 1
    return out


def _finished_job(client: httpx.Client, job_id: str, timeout_s: float = 60.0) -> list[str]:
    """The step plans' ids of a job once it is done."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = client.get(f"/v1/jobs/{job_id}").json()
        if state["status"] == "done":
            return [state["plan_ids"].format(step=k) for k in range(state["total"])]
        if state["status"] not in ("running", "cancelling"):
            raise RuntimeError(f"job {job_id} ended {state['status']}: {state.get('error')}")
        time.sleep(0.1)
    raise RuntimeError(f"job {job_id} did not finish in {timeout_s} s")
