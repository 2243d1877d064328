"""Tuning: plan a stored request again with other options (backend, budget, degree policy, scheme, caps).

The re-plan runs on the service's solve threads (the same admission control as ``POST /v1/plans``: 503
when they are full), within the deployment's limits, and is not stored: it is a measurement. Its budget
counts from the start of the solve, so that re-plans queued behind each other compare fairly, and is the
one the re-plan asks for, else :data:`REPLAN_BUDGET_MS` (at most the server's ``DHP_MAX_BUDGET_MS``):
never the stored request's, which may be a plan-ahead's tens of seconds. Any stored plan can be planned
again, a pending or failed one too: its request was validated when it was stored.
"""

from __future__ import annotations

import json
import time
from typing import Any

from api.service import translate
from api.service.problem_details import ServiceError
from api.service.settings import Settings
from api.store.repository import DEFAULT_BUDGET_MS, PlanRecord
from planning.planner import plan as run_planner

REPLAN_BUDGET_MS = DEFAULT_BUDGET_MS
"""The budget of a re-plan that asks for none: the planner's default, short enough for a dashboard to wait on."""


def merged_request(record: PlanRecord, options: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The stored request document with ``options`` laid over its own options, and the re-plan's budget."""
    if not record.request_json:
        raise ServiceError(
            409,
            "No request stored",
            "this plan has no stored request to plan again",
            kind="no-request",
            field="plan_id",
            hint="pick a plan created through POST /v1/plans.",
        )
    doc = json.loads(record.request_json)
    stored = {k: v for k, v in (doc.get("options") or {}).items() if k != "time_budget_ms"}
    doc["options"] = {**stored, "time_budget_ms": min(REPLAN_BUDGET_MS, settings.max_budget_ms), **options}
    return doc


def replan(record: PlanRecord, options: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Plan the stored request with ``options`` (in a solve thread); raises the planner's errors (422 with the
    field)."""
    doc = merged_request(record, options, settings)
    problem = translate.to_problem(doc, settings)
    start = time.perf_counter()
    result = run_planner(problem)
    planner_ms = (time.perf_counter() - start) * 1000.0
    stats = result.solver
    plan = result.to_json(shards=False)
    groups = [g for mb in plan.get("micro_batches", []) for g in mb.get("groups", [])]
    static = plan.get("static_baseline") or {}
    return {
        "plan_id": record.id,
        "options": doc["options"],
        "predicted_step_time_s": result.predicted_step_time_s,
        "lower_bound_s": result.lower_bound_s,
        "ratio_to_bound": plan.get(
            "ratio_to_bound", result.predicted_step_time_s / result.lower_bound_s if result.lower_bound_s else 0.0
        ),
        "gap": result.gap,
        "backend": stats.backend,
        "solver_status": stats.status,
        "fallback_reason": stats.fallback_reason,
        "planner_ms": planner_ms,
        "solver_wall_ms": stats.wall_ms,
        "micro_batches": len(plan.get("micro_batches", [])),
        "groups": len(groups),
        "largest_group": max((int(g.get("degree", len(g["ranks"]))) for g in groups), default=0),
        "static_speedup": static.get("speedup"),
        "trace": (plan.get("solver") or {}).get("trace", []),
    }
