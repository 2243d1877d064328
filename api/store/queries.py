"""Read-only queries for the tuning dashboard: the plans table with feedback figures, its facets, a change
stamp for live refresh, and feedback joined with the plans it measured (calibration).

Nothing here writes. Figures kept only inside the stored documents (the requested time budget, the
speedup over the static baseline, the profile's source) are read with the database's JSON functions
(SQLite ``json_extract``, PostgreSQL ``#>>``), so they can be sorted on server-side like the columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ColumnElement, Float, Select, String, case, cast, func, literal, select, type_coerce

from api.store.models import FeedbackRow, PlanRow
from api.store.repository import Store, _aware
from optimizer.options import PlanOptions

DEFAULT_BUDGET_MS = PlanOptions().time_budget_ms


def _json_path(store: Store, column: Any, *path: str) -> ColumnElement[Any]:
    """A member of a JSON text column as SQL text (NULL when missing)."""
    if store.engine.dialect.name == "postgresql":
        return cast(column, JSON)[path].as_string()
    return type_coerce(column, JSON)[path].as_string()


def _json_number(store: Store, column: Any, *path: str) -> ColumnElement[Any]:
    doc = cast(column, JSON) if store.engine.dialect.name == "postgresql" else type_coerce(column, JSON)
    return doc[path].as_float()


def budget_ms(store: Store) -> ColumnElement[Any]:
    """The time budget the request asked for (the planner's default when it gave none)."""
    return func.coalesce(_json_number(store, PlanRow.request_json, "options", "time_budget_ms"), literal(DEFAULT_BUDGET_MS, Float))


def speedup(store: Store) -> ColumnElement[Any]:
    """Speedup of the plan over the best static layout (NULL while pending or failed)."""
    return _json_number(store, PlanRow.plan_json, "static_baseline", "speedup")


PROFILE_KEY = '"profile":'
"""How a profile's key reads in the stored request text (compact JSON): text that lacks it has no profile, and
the JSON is only parsed where it is present. Inside a string the quotes would be escaped, so it is never part of a sample id."""


def profile_label(store: Store) -> ColumnElement[Any]:
    """``analytical`` when the request gave no profile, else the profile's ``source`` (``given`` when it has none)."""
    source = _json_path(store, PlanRow.request_json, "profile", "source")
    has_profile = PlanRow.request_json.contains(PROFILE_KEY, autoescape=True)
    whole = _json_path(store, PlanRow.request_json, "profile")
    return case((~has_profile, literal("analytical", String)), (whole.is_(None), literal("analytical", String)),
                else_=func.coalesce(source, literal("given", String)))


def _feedback_summary() -> Any:
    return (select(FeedbackRow.plan_id.label("plan_id"), func.count(FeedbackRow.id).label("n"),
                   func.avg(FeedbackRow.measured_step_time_s).label("mean_s"))
            .group_by(FeedbackRow.plan_id).subquery("fb"))


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
                conds.append(getattr(PlanRow, name) == value)
        if self.created_after:
            conds.append(PlanRow.created_at >= self.created_after)
        if self.created_before:
            conds.append(PlanRow.created_at < self.created_before)
        if self.id_prefix:
            conds.append(PlanRow.id.startswith(self.id_prefix.lower(), autoescape=True))
        return conds


SORT_KEYS = ("created_at", "n_samples", "n_ranks", "cluster", "model", "backend", "budget_ms", "solve_ms", "predicted_step_time_s",
             "lower_bound_s", "gap", "speedup", "measured_step_time_s", "status")


def _sort_column(store: Store, key: str, fb: Any) -> ColumnElement[Any]:
    if key == "budget_ms":
        return budget_ms(store)
    if key == "speedup":
        return speedup(store)
    if key == "measured_step_time_s":
        return fb.c.mean_s
    return getattr(PlanRow, key)


def plan_table(store: Store, filters: PlanFilters, sort: str = "created_at", descending: bool = True, limit: int = 50,
               offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """One page of the plans table, sorted server-side (missing values last), and the count matching the filters."""
    if sort not in SORT_KEYS:
        raise ValueError(f"unknown sort key {sort!r}")
    fb = _feedback_summary()
    conds = filters.conditions()
    key = _sort_column(store, sort, fb)
    order = [key.is_(None), key.desc() if descending else key.asc(), PlanRow.created_at.desc(), PlanRow.id]
    columns = [PlanRow.id, PlanRow.created_at, PlanRow.status, PlanRow.n_samples, PlanRow.n_ranks, PlanRow.cluster, PlanRow.model, PlanRow.backend,
               PlanRow.solver_status, PlanRow.solve_ms, PlanRow.predicted_step_time_s, PlanRow.lower_bound_s, PlanRow.gap]
    page: Select[Any] = (select(PlanRow.id).outerjoin(fb, fb.c.plan_id == PlanRow.id).where(*conds).order_by(*order).limit(limit).offset(offset))
    with store.engine.connect() as conn:
        total = conn.scalar(select(func.count()).select_from(PlanRow).where(*conds)) or 0
        ids = [r[0] for r in conn.execute(page)]
        if not ids:
            return [], int(total)
        # The documents' figures are read for this page's rows only.
        rows = conn.execute(select(*columns, budget_ms(store).label("budget_ms"), speedup(store).label("speedup"), fb.c.n, fb.c.mean_s)
                            .outerjoin(fb, fb.c.plan_id == PlanRow.id).where(PlanRow.id.in_(ids))).mappings().all()
    by_id = {r["id"]: r for r in rows}
    out = []
    for pid in ids:
        r = dict(by_id[pid])
        r["created_at"] = _aware(r["created_at"])
        r["feedback_count"] = int(r.pop("n") or 0)
        r["measured_step_time_s"] = r.pop("mean_s")
        out.append(r)
    return out, int(total)


def facets(store: Store) -> dict[str, list[str]]:
    """The distinct values the table's filters can take."""
    with store.engine.connect() as conn:
        def distinct(col: Any) -> list[str]:
            return [v for (v,) in conn.execute(select(col).where(col.is_not(None)).distinct().order_by(col))]
        return {"status": distinct(PlanRow.status), "backend": distinct(PlanRow.backend), "cluster": distinct(PlanRow.cluster),
                "model": distinct(PlanRow.model)}


def change_stamp(store: Store) -> dict[str, Any]:
    """Counts and newest times of plans (by status) and feedback: the page re-reads its table when these change."""
    with store.engine.connect() as conn:
        by_status = dict(conn.execute(select(PlanRow.status, func.count()).group_by(PlanRow.status)).all())
        latest_plan = conn.scalar(select(func.max(func.coalesce(PlanRow.finished_at, PlanRow.created_at))))
        n_fb, latest_fb = conn.execute(select(func.count(FeedbackRow.id), func.max(FeedbackRow.id))).one()
    return {"plans": int(sum(by_status.values())), "by_status": {k: int(v) for k, v in by_status.items()}, "feedback": int(n_fb or 0),
            "latest_plan_at": _aware(latest_plan), "latest_feedback_id": latest_fb}


def _labels_of_measured_plans(store: Store, conn: Any, cluster: str | None, model: str | None) -> dict[str, tuple[str | None, str | None, str]]:
    """Cluster, model and profile label of every plan with feedback (each plan's request read once, not once per step)."""
    conds: list[ColumnElement[bool]] = [PlanRow.id.in_(select(FeedbackRow.plan_id).distinct())]
    if cluster:
        conds.append(PlanRow.cluster == cluster)
    if model:
        conds.append(PlanRow.model == model)
    rows = conn.execute(select(PlanRow.id, PlanRow.cluster, PlanRow.model, profile_label(store)).where(*conds))
    return {pid: (c, m, label) for pid, c, m, label in rows}


def calibration_points(store: Store, *, cluster: str | None = None, model: str | None = None, profile: str | None = None,
                       limit: int = 100_000) -> tuple[list[dict[str, Any]], int]:
    """Feedback with a prediction, newest first (at most ``limit``), with the plan's cluster, model and profile; and how many there are."""
    with store.engine.connect() as conn:
        labels = _labels_of_measured_plans(store, conn, cluster, model)
        if profile:
            labels = {k: v for k, v in labels.items() if v[2] == profile}
        rows = conn.execute(select(FeedbackRow.id, FeedbackRow.plan_id, FeedbackRow.created_at, FeedbackRow.predicted_step_time_s, FeedbackRow.measured_step_time_s)
                            .where(FeedbackRow.predicted_step_time_s.is_not(None)).order_by(FeedbackRow.id.desc()))
        out = []
        total = 0
        for fid, pid, created, predicted, measured in rows:
            where = labels.get(pid)
            if where is None:
                continue
            total += 1
            if len(out) < limit:
                out.append({"id": fid, "plan_id": pid, "created_at": _aware(created), "predicted_step_time_s": predicted, "measured_step_time_s": measured,
                            "cluster": where[0], "model": where[1], "profile": where[2]})
    return out, total


def profile_labels(store: Store) -> list[str]:
    """The profile labels of plans that have feedback."""
    with store.engine.connect() as conn:
        return sorted({label for _, _, label in _labels_of_measured_plans(store, conn, None, None).values() if label})
