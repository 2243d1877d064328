"""The one-plan view: a stored plan laid out as micro-batches x ranks (the Gantt chart's blocks), its solver's
trace and phases, the static baseline, communicators and feedback.

Read from the stored documents only; the cluster is read again from the stored request to know which
ranks share a node and each node's GPU type (a request whose cluster cannot be read any more still shows,
without node lines).
"""

from __future__ import annotations

import json
from typing import Any

from api.store.profile_names import profile_name
from api.store.queries import DEFAULT_BACKEND
from api.store.repository import FeedbackRecord, PlanRecord, request_columns
from optimizer.errors import PlannerError
from optimizer.presets import load_preset
from optimizer.problem.documents import cluster_from_json


def profile_label(request: dict[str, Any]) -> str:
    """The store's label of the request's profile: ``analytical`` without one, else its ``source`` (``given`` when
    it has none)."""
    return str(request_columns(request)["profile"])


def cluster_nodes(request: dict[str, Any]) -> tuple[list[list[int]], list[str]]:
    """Per node holding domain ranks, the half-open range of its ranks and its GPU type's name; both empty when
    the stored cluster cannot be read."""
    try:
        doc = request.get("cluster")
        if doc is None:
            doc = load_preset("clusters", request.get("cluster_preset") or "h100-8x8", "cluster_preset")
        cluster = cluster_from_json(doc)
        ranges = [list(r) for r in cluster.node_rank_ranges]
        return ranges, [cluster.rank_gpu(a).name for a, _ in ranges]
    except (PlannerError, KeyError, TypeError, ValueError, OSError):
        return [], []


def runs(ranks: list[int]) -> list[list[int]]:
    """Sorted ranks as half-open runs of consecutive ranks: [0, 1, 2, 5] -> [[0, 3], [5, 6]]."""
    out: list[list[int]] = []
    for r in sorted(ranks):
        if out and out[-1][1] == r:
            out[-1][1] = r + 1
        else:
            out.append([r, r + 1])
    return out


def _node_of(ranges: list[list[int]]) -> dict[int, int]:
    return {r: k for k, (a, b) in enumerate(ranges) for r in range(a, b)}


def gantt(
    plan: dict[str, Any],
    ranges: list[list[int]],
    measured: list[list[float]] | None,
    node_gpus: list[str] | None = None,
) -> dict[str, Any]:
    """Blocks of the Gantt chart: micro-batches one after the other on the time axis (numbered from 0, as in the
    plan and ``group_times_s``), each group a block over its ranks; ``node_gpus`` names each node's GPU type."""
    domain = int(plan.get("domain_size") or 0)
    node_of = _node_of(ranges)
    start = 0.0
    busy = 0.0
    mbs = []
    for m, mb in enumerate(plan.get("micro_batches", [])):
        t = float(mb["predicted_time_s"])
        groups = []
        used: set[int] = set()
        idle = 0.0
        for g, grp in enumerate(mb.get("groups", [])):
            ranks = [int(r) for r in grp["ranks"]]
            gt = float(grp["predicted_time_s"])
            used.update(ranks)
            idle += (t - gt) * len(ranks)
            busy += gt * len(ranks)
            measured_t = None
            if measured is not None and m < len(measured) and g < len(measured[m]):
                measured_t = float(measured[m][g])
            groups.append(
                {
                    "index": g,
                    "ranks": ranks,
                    "spans": runs(ranks),
                    "degree": int(grp.get("degree", len(ranks))),
                    "samples": [str(s) for s in grp.get("samples", [])],
                    "predicted_time_s": gt,
                    "idle_s": max(0.0, t - gt),
                    "intra_node": bool(grp.get("intra_node", True)),
                    "nodes": sorted({node_of[r] for r in ranks if r in node_of}),
                    "measured_time_s": measured_t,
                }
            )
        domain = max(domain, max(used, default=-1) + 1)
        unused = [r for r in range(domain) if r not in used]
        idle += t * len(unused)
        mbs.append(
            {
                "index": m,
                "start_s": start,
                "predicted_time_s": t,
                "idle_rank_s": idle,
                "unused_ranks": unused,
                "groups": groups,
            }
        )
        start += t
    return {
        "domain_size": domain,
        "step_s": start,
        "nodes": ranges,
        "node_gpus": list(node_gpus or []),
        "utilisation": busy / (domain * start) if domain and start > 0 else 0.0,
        "micro_batches": mbs,
    }


def _solver(plan: dict[str, Any]) -> dict[str, Any] | None:
    solver = plan.get("solver")
    if not isinstance(solver, dict):
        return None
    details = solver.get("details") or {}
    keep = ("backend", "status", "wall_ms", "objective_s", "bound_s", "fallback_reason", "trace")
    out = {k: solver[k] for k in keep if k in solver}
    out["phases"] = details.get("phases", {})
    out["bound"] = details.get("bound")
    out["rounds"] = details.get("rounds")
    return out


def _feedback(fb: FeedbackRecord) -> dict[str, Any]:
    doc = fb.document
    return {
        "id": fb.id,
        "created_at": fb.created_at,
        "measured_step_time_s": fb.measured_step_time_s,
        "predicted_step_time_s": fb.predicted_step_time_s,
        "step": doc.get("step"),
        "group_times_s": doc.get("group_times_s"),
        "notes": doc.get("notes"),
    }


def plan_view(record: PlanRecord, feedback: list[FeedbackRecord]) -> dict[str, Any]:
    request = json.loads(record.request_json) if record.request_json else {}
    options = request.get("options") or {}
    out: dict[str, Any] = {
        "id": record.id,
        "status": record.status,
        "created_at": record.created_at,
        "cluster": record.cluster,
        "model": record.model,
        "profile": profile_label(request),
        "profile_name": profile_name(profile_label(request)),
        "backend_asked": str(options.get("backend") or DEFAULT_BACKEND),
        "n_samples": record.n_samples,
        "n_ranks": record.n_ranks,
        "options": options,
        # The record's column: what the budget came to ("auto" is a share of the previous step's time).
        "budget_ms": record.budget_ms if record.budget_ms is not None else request_columns(request)["budget_ms"],
        "feedback": [_feedback(f) for f in feedback],
        "error": record.error,
    }
    if record.status != "done" or not record.plan_json:
        return out
    plan = json.loads(record.plan_json)
    measured = next((f.document["group_times_s"] for f in reversed(feedback) if f.document.get("group_times_s")), None)
    out.update(
        {
            k: plan.get(k)
            for k in ("predicted_step_time_s", "lower_bound_s", "ratio_to_bound", "gap", "scheme", "static_baseline")
        }
    )
    out["solver"] = _solver(plan)
    out["communicators"] = plan.get("communicators") or []
    if "new_communicators" in plan:
        out["new_communicators"] = plan["new_communicators"]
    ranges, gpus = cluster_nodes(request)
    out["gantt"] = gantt(plan, ranges, measured, gpus)
    return out
