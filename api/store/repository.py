"""The repository: every read and write of the plan store goes through :class:`Store`.

SQLite (the embedded default) runs in WAL mode so readers never block the writer; PostgreSQL is
used through the psycopg 3 driver. Each method is one short transaction and is safe to call from
worker threads.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any, overload

from sqlalchemy import Engine, create_engine, event, func, insert, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from api.store.models import PLANS, FeedbackRow, PlanRecord
from optimizer.plan.records import Plan
from optimizer.problem.options import PlanOptions

ID_PATTERN = re.compile(r"[0-9A-Za-z_-]{1,32}")
"""Every id the store holds (plans: 32 hex digits; an epoch job's steps: the job's id, a dash and the step)."""


def is_id(value: str) -> bool:
    """Whether ``value`` can be a stored id; anything else is not looked up (the database never sees it)."""
    return ID_PATTERN.fullmatch(value) is not None


def utcnow() -> datetime:
    return datetime.now(UTC)


@overload
def _aware(value: datetime) -> datetime: ...
@overload
def _aware(value: datetime | None) -> datetime | None: ...
def _aware(value: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; every stored time is UTC.
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


SUMMARY_FIELDS = tuple(
    f.name
    for f in fields(PlanRecord)
    if f.name not in ("request_hash", "plan_json", "error_json", "request_json", "claimed_at")
)
"""The fields of a record that the plan list shows (everything but the documents and the hash)."""


DEFAULT_BUDGET_MS = PlanOptions().budget_ms
PROFILE_LABEL_LENGTH = 200


def request_columns(request: Any) -> dict[str, Any]:
    """``budget_ms`` and ``profile`` from a request document."""
    options = request.get("options") if isinstance(request, dict) else None
    budget = options.get("time_budget_ms") if isinstance(options, dict) else None
    profile = request.get("profile") if isinstance(request, dict) else None
    return {
        "budget_ms": float(budget)
        if isinstance(budget, (int, float)) and not isinstance(budget, bool)
        else DEFAULT_BUDGET_MS,
        "profile": "analytical"
        if not isinstance(profile, dict)
        else str(profile.get("source") or "given")[:PROFILE_LABEL_LENGTH],
    }


def plan_speedup(plan: Plan) -> float | None:
    """The ``speedup`` column of a plan (its speedup over the static baseline, when finite)."""
    speedup = plan.speedup_over_static
    return float(speedup) if speedup is not None and math.isfinite(speedup) else None


def document_columns(request_json: str | None, plan_json: str | None) -> dict[str, Any]:
    """The columns that repeat figures of the stored documents, so that lists sort and filter on them in the
    database: ``budget_ms`` and ``profile`` from the request, ``speedup`` from the plan (each only when its
    document is given). Written with the documents, never edited apart from them. This parses the documents:
    a caller that holds them parsed (the service) fills the record's columns itself (:func:`request_columns`,
    :func:`plan_speedup`)."""
    out: dict[str, Any] = {}
    if request_json is not None:
        out.update(request_columns(json.loads(request_json)))
    if plan_json is not None:
        plan = json.loads(plan_json)
        baseline = plan.get("static_baseline") if isinstance(plan, dict) else None
        speedup = baseline.get("speedup") if isinstance(baseline, dict) else None
        out["speedup"] = float(speedup) if isinstance(speedup, (int, float)) and not isinstance(speedup, bool) else None
    return out


SOLVED_FIELDS = ("backend", "solver_status", "predicted_step_time_s", "lower_bound_s", "gap", "solve_ms")


def solved_columns(plan: Plan) -> dict[str, Any]:
    """The columns a solved plan fills (SOLVED_FIELDS), from the plan itself: the one place that maps a plan to its
    record."""
    values = (
        plan.solver.backend,
        plan.solver.status,
        plan.predicted_step_time_s,
        plan.lower_bound_s,
        plan.gap,
        plan.solver.wall_ms,
    )
    return dict(zip(SOLVED_FIELDS, values, strict=True))


@dataclass(frozen=True)
class FeedbackRecord:
    id: int
    plan_id: str
    created_at: datetime
    measured_step_time_s: float
    predicted_step_time_s: float | None
    document: dict[str, Any]
    replayed: bool = False
    """Stored by an earlier try of the same request (same idempotency key), not by this one."""


def _feedback_record(row: FeedbackRow, replayed: bool = False) -> FeedbackRecord:
    return FeedbackRecord(
        row.id,
        row.plan_id,
        _aware(row.created_at),
        row.measured_step_time_s,
        row.predicted_step_time_s,  # type: ignore[arg-type]
        json.loads(row.feedback_json),
        replayed=replayed,
    )


_SUMMARY_COLUMNS = [c for c in PLANS.columns if c.name not in ("plan_json", "request_json")]


def _record(row: Any, with_documents: bool) -> PlanRecord:
    data = {c.name: getattr(row, c.name) for c in _SUMMARY_COLUMNS}
    data["created_at"] = _aware(data["created_at"])
    data["finished_at"] = _aware(data["finished_at"])
    data["claimed_at"] = _aware(data["claimed_at"])
    if with_documents:
        data["plan_json"] = row.plan_json
        data["request_json"] = row.request_json
    return PlanRecord(**data)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


class Store:
    """Plans and feedback in one database."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._session = sessionmaker(self.engine, expire_on_commit=False)

    def close(self) -> None:
        self.engine.dispose()

    def ping(self) -> bool:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return True
        except Exception:
            return False

    # -- plans ------------------------------------------------------------------------------

    def add(self, record: PlanRecord) -> None:
        """Store a record; its figure columns are read from its documents unless it carries them (``budget_ms`` set)."""
        columns = {} if record.budget_ms is not None else document_columns(record.request_json, record.plan_json)
        with self.engine.begin() as conn:
            conn.execute(insert(PLANS), [{**record.__dict__, **columns}])

    def add_if_absent(self, record: PlanRecord) -> bool:
        """Store a record unless one of its id is stored already (False then: that one is kept)."""
        try:
            self.add(record)
        except IntegrityError:
            return False
        return True

    def save_done(self, record: PlanRecord) -> None:
        """Store a solved record; a pending record of the same id (a plan-ahead request that joined this solve) is
        settled with it instead. Whichever of the two writes comes first, the plan ends done under that id."""
        if not self.add_if_absent(record):
            self.finish_from(record.id, record)

    def finish(self, plan_id: str, plan_json: str, plan: Plan) -> bool:
        """Mark a pending plan done with its plan document and :func:`solved_columns`. The first answer
        stored wins: a plan that is no longer pending is left as it is (False)."""
        speedup = (
            plan_speedup(plan) if hasattr(plan, "speedup_over_static") else document_columns(None, plan_json)["speedup"]
        )
        return self._settle(plan_id, status="done", plan_json=plan_json, **solved_columns(plan), speedup=speedup)

    def finish_from(self, plan_id: str, done: PlanRecord) -> bool:
        """Mark a pending plan done with the plan of another record (an identical request solved once)."""
        columns = {name: getattr(done, name) for name in SOLVED_FIELDS}
        return self._settle(plan_id, status="done", plan_json=done.plan_json, **columns, speedup=done.speedup)

    def fail(self, plan_id: str, error: dict[str, Any]) -> bool:
        return self._settle(plan_id, status="failed", error_json=json.dumps(error))

    def _settle(self, plan_id: str, **values: Any) -> bool:
        with self._session.begin() as s:
            done = s.execute(
                update(PLANS)
                .where(PLANS.c.id == plan_id, PLANS.c.status == "pending")
                .values(finished_at=utcnow(), **values)
            )
            return bool(done.rowcount)  # type: ignore[attr-defined]

    def claim_pending(self, started_before: datetime, limit: int = 1000) -> list[PlanRecord]:
        """Pending plans that no process took up since ``started_before`` (the start of the calling process), each
        claimed for the caller in one conditional update, so that processes starting together resume each plan once."""
        stale = (PLANS.c.status == "pending") & ((PLANS.c.claimed_at.is_(None)) | (PLANS.c.claimed_at < started_before))
        with self.engine.connect() as conn:
            ids = [
                r[0] for r in conn.execute(select(PLANS.c.id).where(stale).order_by(PLANS.c.created_at).limit(limit))
            ]
        claimed = []
        for plan_id in ids:
            with self._session.begin() as s:
                took = s.execute(update(PLANS).where(PLANS.c.id == plan_id, stale).values(claimed_at=utcnow()))
            if took.rowcount:  # type: ignore[attr-defined]
                record = self.get(plan_id)
                if record is not None:
                    claimed.append(record)
        return claimed

    def get(self, plan_id: str, *, with_documents: bool = True) -> PlanRecord | None:
        if not is_id(plan_id):
            return None
        columns = PLANS.c if with_documents else _SUMMARY_COLUMNS
        with self.engine.connect() as conn:
            row = conn.execute(select(*columns).where(PLANS.c.id == plan_id)).first()
            return _record(row, with_documents) if row is not None else None

    def find_done(self, request_hash: str) -> PlanRecord | None:
        """The newest finished plan for this request hash (the lasting plan cache)."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(*PLANS.c)
                .where(PLANS.c.request_hash == request_hash, PLANS.c.status == "done")
                .order_by(PLANS.c.created_at.desc())
                .limit(1)
            ).first()
            return _record(row, True) if row is not None else None

    def search(
        self,
        *,
        status: str | None = None,
        backend: str | None = None,
        cluster: str | None = None,
        model: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[PlanRecord], int]:
        """Plans, newest first, without their documents; and the total matching the filters."""
        conds = []
        if status:
            conds.append(PLANS.c.status == status)
        if backend:
            conds.append(PLANS.c.backend == backend)
        if cluster:
            conds.append(PLANS.c.cluster == cluster)
        if model:
            conds.append(PLANS.c.model == model)
        if created_after:
            conds.append(PLANS.c.created_at >= created_after)
        if created_before:
            conds.append(PLANS.c.created_at < created_before)
        with self._session() as s:
            total = s.scalar(select(func.count()).select_from(PLANS).where(*conds)) or 0
            rows = s.execute(
                select(*_SUMMARY_COLUMNS)
                .where(*conds)
                .order_by(PLANS.c.created_at.desc(), PLANS.c.id)
                .limit(limit)
                .offset(offset)
            ).all()
            return [_record(r, False) for r in rows], int(total)

    # -- feedback ---------------------------------------------------------------------------

    def add_feedback(
        self, plan_id: str, measured_step_time_s: float, document: dict[str, Any], idempotency_key: str | None = None
    ) -> FeedbackRecord | None:
        """Store feedback beside the plan's prediction; None when the plan does not exist. Feedback sent again with
        the same ``idempotency_key`` (a retried POST) is stored once: the record stored the first time comes back,
        marked ``replayed``."""
        if not is_id(plan_id):
            return None
        if idempotency_key is not None:
            kept = self._feedback_by_key(plan_id, idempotency_key)
            if kept is not None:
                return kept
        try:
            with self._session.begin() as s:
                plan = s.execute(select(PLANS.c.predicted_step_time_s).where(PLANS.c.id == plan_id)).first()
                if plan is None:
                    return None
                row = FeedbackRow(
                    plan_id=plan_id,
                    created_at=utcnow(),
                    measured_step_time_s=measured_step_time_s,
                    predicted_step_time_s=plan.predicted_step_time_s,
                    feedback_json=json.dumps(document),
                    idempotency_key=idempotency_key,
                )
                s.add(row)
                s.flush()
                return FeedbackRecord(
                    row.id, plan_id, row.created_at, measured_step_time_s, plan.predicted_step_time_s, document
                )
        except IntegrityError:  # the same key stored meanwhile by a concurrent try
            kept = self._feedback_by_key(plan_id, idempotency_key) if idempotency_key is not None else None
            if kept is None:
                raise
            return kept

    def _feedback_by_key(self, plan_id: str, key: str) -> FeedbackRecord | None:
        with self._session() as s:
            r = s.scalars(
                select(FeedbackRow).where(FeedbackRow.plan_id == plan_id, FeedbackRow.idempotency_key == key)
            ).first()
            return None if r is None else _feedback_record(r, replayed=True)

    def feedback_for(self, plan_id: str) -> list[FeedbackRecord]:
        if not is_id(plan_id):
            return []
        with self._session() as s:
            rows = s.scalars(select(FeedbackRow).where(FeedbackRow.plan_id == plan_id).order_by(FeedbackRow.id)).all()
            return [_feedback_record(r) for r in rows]
