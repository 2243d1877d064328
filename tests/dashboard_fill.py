"""A planning service filled the way the dashboard's users fill it: `dhp bench`-style plans (seeded workloads of
bench's generators on the 64-rank H100 preset, several backends, budgets and profiles) posted through the API,
and synthetic trainer feedback: measured = predicted x a per-profile bias x seeded noise (the bias of the
FlexSP-fitted profile is set above the re-profiling threshold on purpose, so the calibration view has
something to flag)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import httpx

from optimizer.costs.zoo import load_profile
from optimizer.problem.workloads import WORKLOADS

BIAS = {"analytical": 1.03, "flexsp-gpt7b": 1.16}
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
    profile_of: dict[str, str] = field(default_factory=dict)
    feedback: int = 0


def fill(url: str, headers: dict[str, str] | None = None, steps: int = 3, seed: int = 0) -> Filled:
    """Post the plans and ``steps`` feedback documents per plan; each plan's first step also carries per-group times."""
    rng = random.Random(seed)
    out = Filled()
    with httpx.Client(base_url=url, headers=headers or {}, timeout=60) as client:
        for spec in PLANS:
            r = client.post("/v1/plans", json=request(*spec))
            r.raise_for_status()
            plan = r.json()
            out.plans.append(plan)
            out.profile_of[plan["id"]] = spec[5] or "analytical"
        for k, plan in enumerate(out.plans):
            bias = BIAS[out.profile_of[plan["id"]]]
            for step in range(steps):
                body: dict[str, Any] = {
                    "measured_step_time_s": plan["predicted_step_time_s"] * bias * (1 + rng.gauss(0, 0.025)),
                    "step": 100 * k + step,
                }
                if step == 0:
                    body["group_times_s"] = [
                        [g["predicted_time_s"] * bias * (1 + rng.gauss(0, 0.03)) for g in mb["groups"]]
                        for mb in plan["micro_batches"]
                    ]
                client.post(f"/v1/plans/{plan['id']}/feedback", json=body).raise_for_status()
                out.feedback += 1
    return out
