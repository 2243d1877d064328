"""Read-only queries for the tuning dashboard: the plans table with feedback figures, its facets, a change
stamp for live refresh, and feedback joined with the plans it measured (calibration).

Nothing here writes. The figures that live inside the stored documents (the requested time budget, the
speedup over the static baseline, the profile's label) are read from the columns the store writes beside
the documents (:func:`api.store.repository.document_columns`), so they sort server-side like the others.
The backend the request asked for is shown but not sorted on: the database reads it out of the stored
request (:func:`requested_backend`), once per plan (:func:`plan_facts`).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import JSON, ColumnElement, Float, Select, String, func, literal, select
from sqlalchemy import cast as sql_cast

from api.store.models import PLANS, FeedbackRow
from api.store.repository import DEFAULT_BUDGET_MS, Store, _aware
from optimizer.problem.options import PlanOptions

DEFAULT_BACKEND = PlanOptions().backend
"""The backend a request that names none asks for."""


def budget_ms(store: Store) -> ColumnElement[Any]:
    """The time budget the request asked for (the planner's default when it gave none)."""
    return func.coalesce(PLANS.c.budget_ms, literal(DEFAULT_BUDGET_MS, Float))


def speedup(store: Store) -> ColumnElement[Any]:
    """Speedup of the plan over the best static layout (NULL while pending or failed)."""
    return cast(ColumnElement[Any], PLANS.c.speedup)


def profile_label(store: Store) -> ColumnElement[Any]:
    """``analytical`` when the request gave no profile, else the profile's ``source`` (``given`` when it has none)."""
    return func.coalesce(PLANS.c.profile, literal("analytical", String))


def requested_backend(store: Store) -> ColumnElement[Any]:
    """The backend the request asked for: its ``options.backend``, else :data:`DEFAULT_BACKEND`. Read by the
    database out of the stored request text (SQLite's ``json_extract``, PostgreSQL's ``json_extract_path_text``),
    so the request's batch never leaves the database."""
    if store.engine.dialect.name == "postgresql":
        asked = func.json_extract_path_text(sql_cast(PLANS.c.request_json, JSON), "options", "backend")
    else:
        asked = func.json_extract(PLANS.c.request_json, "$.options.backend")
    return func.coalesce(asked, literal(DEFAULT_BACKEND, String))


def _feedback_summary() -> Any:
    return (
        select(
            FeedbackRow.plan_id.label("plan_id"),
            func.count(FeedbackRow.id).label("n"),
            func.avg(FeedbackRow.measured_step_time_s).label("mean_s"),
        )
        .group_by(FeedbackRow.plan_id)
        .subquery("fb")
    )


@dataclass(frozen=True)
class PlanFacts:
    """What the dashboard reads of a plan: its names and the figures the store keeps beside its documents. None of it
    changes once the plan is finished (the request never changes; the plan document is written once), so it is kept
    in memory from then on."""

    cluster: str | None
    model: str | None
    profile: str
    budget_ms: float
    speedup: float | None
    backend_asked: str


_FACTS: weakref.WeakKeyDictionary[Store, dict[str, PlanFacts]] = weakref.WeakKeyDictionary()
_FACTS_LOCK = threading.Lock()
FACTS_KEPT = 500_000
"""Plans whose facts one process keeps (about 200 bytes each); beyond that the memory starts afresh."""


def plan_facts(store: Store, ids: list[str]) -> dict[str, PlanFacts]:
    """Facts of these plans: from memory, else read from the documents (and kept once the plan is finished)."""
    with _FACTS_LOCK:
        memo = _FACTS.setdefault(store, {})
        out = {i: memo[i] for i in ids if i in memo}
    missing = [i for i in ids if i not in out]
    if not missing:
        return out
    fresh: dict[str, PlanFacts] = {}
    final: dict[str, PlanFacts] = {}
    with store.engine.connect() as conn:
        for k in range(0, len(missing), 500):
            rows = conn.execute(
                select(
                    PLANS.c.id,
                    PLANS.c.status,
                    PLANS.c.cluster,
                    PLANS.c.model,
                    profile_label(store),
                    budget_ms(store),
                    speedup(store),
                    requested_backend(store),
                ).where(PLANS.c.id.in_(missing[k : k + 500]))
            )
            for pid, status, cluster, model, label, budget, gain, asked in rows:
                facts = PlanFacts(cluster, model, label, float(budget), gain, str(asked))
                fresh[pid] = facts
                if status != "pending":
                    final[pid] = facts
    with _FACTS_LOCK:
        if len(memo) + len(final) > FACTS_KEPT:
            memo.clear()
        memo.update(final)
    out.update(fresh)
    return out


@dataclass(frozen=True)
class PlanFilters:
    status: str | None = None
    backend: str | None = None
    cluster: str | None = None
    model: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    id_prefix: str | None = None

    def conditions(self) -> list[ColumnElement[bool]]:
        conds: list[ColumnElement[bool]] = []
        for name in ("status", "backend", "cluster", "model"):
            value = getattr(self, name)
            if value:
                conds.append(PLANS.c[name] == value)
        if self.created_after:
            conds.append(PLANS.c.created_at >= self.created_after)
        if self.created_before:
            conds.append(PLANS.c.created_at < self.created_before)
        if self.id_prefix:
            conds.append(PLANS.c.id.startswith(self.id_prefix.lower(), autoescape=True))
        return conds


TABLE_FIELDS = (
    "id",
    "created_at",
    "status",
    "n_samples",
    "n_ranks",
    "cluster",
    "model",
    "backend",
    "solver_status",
    "budget_ms",
    "solve_ms",
    "predicted_step_time_s",
    "lower_bound_s",
    "gap",
    "speedup",
    "profile",
)
"""The fields of a stored record that a row of the plans table shows (with its feedback's count and mean, and the
backend the request asked for)."""
FACT_FIELDS = ("budget_ms", "speedup", "profile")
"""Fields of a table row read through :func:`plan_facts` (kept in memory once a plan is finished)."""

UNSORTED_FIELDS = ("id", "solver_status", "profile")
"""Table fields the plans table is not sorted on (the profile: its label is the profile's long source text, not the
name the table shows)."""
SORT_KEYS = tuple(name for name in TABLE_FIELDS if name not in UNSORTED_FIELDS) + ("measured_step_time_s",)
"""What the plans table sorts on: its fields but the unsorted ones, and the mean measured step time."""


def _sort_column(store: Store, key: str, fb: Any) -> ColumnElement[Any]:
    if key == "measured_step_time_s":
        return fb.c.mean_s
    if key == "budget_ms":
        return budget_ms(store)
    return PLANS.c[key]


def plan_table(
    store: Store,
    filters: PlanFilters,
    sort: str = "created_at",
    descending: bool = True,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[dict[str, Any]], int]:
    """One page of the plans table, sorted server-side (missing values last), and the count matching the filters."""
    if sort not in SORT_KEYS:
        raise ValueError(f"unknown sort key {sort!r}")
    fb = _feedback_summary()
    conds = filters.conditions()
    columns = [PLANS.c[name] for name in TABLE_FIELDS if name not in FACT_FIELDS]
    with store.engine.connect() as conn:
        total = conn.scalar(select(func.count()).select_from(PLANS).where(*conds)) or 0
        key = _sort_column(store, sort, fb)
        order = [key.is_(None), key.desc() if descending else key.asc(), PLANS.c.created_at.desc(), PLANS.c.id]
        page: Select[Any] = (
            select(PLANS.c.id)
            .outerjoin(fb, fb.c.plan_id == PLANS.c.id)
            .where(*conds)
            .order_by(*order)
            .limit(limit)
            .offset(offset)
        )
        ids = [r[0] for r in conn.execute(page)]
        if not ids:
            return [], int(total)
        rows = (
            conn.execute(
                select(*columns, fb.c.n, fb.c.mean_s)
                .outerjoin(fb, fb.c.plan_id == PLANS.c.id)
                .where(PLANS.c.id.in_(ids))
            )
            .mappings()
            .all()
        )
    by_id = {r["id"]: r for r in rows}
    facts = plan_facts(store, ids)
    out = []
    for pid in ids:
        r = dict(by_id[pid])
        r["created_at"] = _aware(r["created_at"])
        r["feedback_count"] = int(r.pop("n") or 0)
        r["measured_step_time_s"] = r.pop("mean_s")
        r["budget_ms"] = facts[pid].budget_ms
        r["speedup"] = facts[pid].speedup
        r["profile"] = facts[pid].profile
        r["backend_asked"] = facts[pid].backend_asked
        out.append(r)
    return out, int(total)


_FACETS: weakref.WeakKeyDictionary[Store, tuple[Any, dict[str, list[str]]]] = weakref.WeakKeyDictionary()


def facets(store: Store) -> dict[str, list[str]]:
    """The distinct values the table's filters can take; read again only when plans were added or finished."""
    with store.engine.connect() as conn:
        stamp = (
            conn.execute(select(func.count(), func.max(PLANS.c.created_at)).select_from(PLANS)).one(),
            tuple(
                conn.execute(
                    select(PLANS.c.status, func.count()).group_by(PLANS.c.status).order_by(PLANS.c.status)
                ).all()
            ),
        )
        kept = _FACETS.get(store)
        if kept is not None and kept[0] == stamp:
            return kept[1]

        def distinct(col: Any) -> list[str]:
            return [v for (v,) in conn.execute(select(col).where(col.is_not(None)).distinct().order_by(col))]

        out = {
            "status": distinct(PLANS.c.status),
            "backend": distinct(PLANS.c.backend),
            "cluster": distinct(PLANS.c.cluster),
            "model": distinct(PLANS.c.model),
        }
    _FACETS[store] = (stamp, out)
    return out


def change_stamp(store: Store) -> dict[str, Any]:
    """Counts and newest times of plans (by status) and feedback: the page re-reads its table when these change."""
    with store.engine.connect() as conn:
        by_status: dict[str, int] = dict(
            conn.execute(select(PLANS.c.status, func.count()).group_by(PLANS.c.status)).all()
        )
        latest_plan = conn.scalar(select(func.max(func.coalesce(PLANS.c.finished_at, PLANS.c.created_at))))
        n_fb, latest_fb = conn.execute(select(func.count(FeedbackRow.id), func.max(FeedbackRow.id))).one()
    return {
        "plans": int(sum(by_status.values())),
        "by_status": {k: int(v) for k, v in by_status.items()},
        "feedback": int(n_fb or 0),
        "latest_plan_at": _aware(latest_plan),
        "latest_feedback_id": latest_fb,
    }


def _measured_plans(conn: Any) -> list[str]:
    return [pid for (pid,) in conn.execute(select(FeedbackRow.plan_id).distinct())]


def calibration_points(
    store: Store,
    *,
    cluster: str | None = None,
    model: str | None = None,
    profile: str | None = None,
    limit: int = 100_000,
) -> tuple[list[dict[str, Any]], int]:
    """Feedback with a prediction, newest first (at most ``limit``), with the plan's cluster, model and profile; and
    how many there are."""
    with store.engine.connect() as conn:
        facts = plan_facts(store, _measured_plans(conn))
        labels = {
            pid: (f.cluster, f.model, f.profile)
            for pid, f in facts.items()
            if (not cluster or f.cluster == cluster)
            and (not model or f.model == model)
            and (not profile or f.profile == profile)
        }
        rows = conn.execute(
            select(
                FeedbackRow.id,
                FeedbackRow.plan_id,
                FeedbackRow.created_at,
                FeedbackRow.predicted_step_time_s,
                FeedbackRow.measured_step_time_s,
            )
            .where(FeedbackRow.predicted_step_time_s.is_not(None))
            .order_by(FeedbackRow.id.desc())
        )
        out: list[dict[str, Any]] = []
        total = 0
        for fid, pid, created, predicted, measured in rows:
            where = labels.get(pid)
            if where is None:
                continue
            total += 1
            if len(out) < limit:
                out.append(
                    {
                        "id": fid,
                        "plan_id": pid,
                        "created_at": _aware(created),
                        "predicted_step_time_s": predicted,
                        "measured_step_time_s": measured,
                        "cluster": where[0],
                        "model": where[1],
                        "profile": where[2],
                    }
                )
    return out, total


def profile_labels(store: Store) -> list[str]:
    """The profile labels of plans that have feedback."""
    with store.engine.connect() as conn:
        ids = _measured_plans(conn)
    return sorted({f.profile for f in plan_facts(store, ids).values()})
