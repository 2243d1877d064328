"""Helpers for the service tests: small requests, plan checks and a real server process on loopback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from api.local_server import LocalServer as ServerProcess  # noqa: F401  (the tests' name for it)
from api.local_server import free_port  # noqa: F401
from optimizer.plan.records import assignment_from_json
from optimizer.problem.documents import problem_from_json
from optimizer.problem.workloads import WORKLOADS
from optimizer.verify.verifier import check_assignment

ROOT = Path(__file__).resolve().parent.parent


def small_request(
    n: int = 24, seed: int = 0, workload: str = "video", nodes: int = 2, **options: Any
) -> dict[str, Any]:
    return {
        "batch": WORKLOADS[workload](n, seed=seed),
        "cluster": {"nodes": nodes, "gpus_per_node": 8},
        "model_preset": "qwen2-vl-7b",
        "options": {"backend": "heuristic", "time_budget_ms": 2000, **options},
    }


def assert_verified(plan_doc: dict[str, Any], request_doc: dict[str, Any]) -> None:
    """The plan covers the batch on the cluster within memory, and its step time is what the cost model says."""
    problem = problem_from_json({k: v for k, v in request_doc.items() if k not in ("wait", "cache")})
    report = check_assignment(problem, assignment_from_json(plan_doc, problem.batch.index))
    assert report.ok, report.violations
    assert abs(report.step_time_s - plan_doc["predicted_step_time_s"]) <= 1e-9 * max(1.0, report.step_time_s)


def empty_postgres(url: str) -> Any:
    """A store on the PostgreSQL server at ``url`` with its tables dropped (a clean schema for one test)."""
    from sqlalchemy import text

    from api.store import Store

    store = Store(url)
    with store.engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS profiles, feedback, plans, jobs, alembic_version CASCADE"))
    return store
