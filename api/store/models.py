"""Tables of the plan store. Changes to them go with a migration in ``api/store/migrations/versions``.

Documents (the normalised request, the plan, solver statistics) are kept as JSON text: the plan
text is exactly the body the service returns, so reading a plan back costs no re-encoding, and the
same column type works on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from datetime import datetime
from types import NoneType
from typing import Any, get_args, get_type_hints

from sqlalchemy import Column, DateTime, Float, ForeignKey, Index, Integer, String, Table, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeEngine


class Base(DeclarativeBase):
    pass


def column(
    sql: TypeEngine[Any] | type[TypeEngine[Any]],
    doc: str | None = None,
    *,
    default: Any = MISSING,
    index: bool = False,
    primary_key: bool = False,
    nullable: bool | None = None,
) -> Any:
    """A field of :class:`PlanRecord` and its column: ``sql`` its type; nullable when the field's type admits None,
    unless ``nullable`` says otherwise; ``doc`` what it holds (the listings' descriptions)."""
    metadata = {"sql": sql, "doc": doc, "index": index, "primary_key": primary_key, "nullable": nullable}
    return field(metadata=metadata) if default is MISSING else field(default=default, metadata=metadata)


TIMESTAMP = DateTime(timezone=True)


@dataclass(frozen=True)
class PlanRecord:
    """One stored plan request and, once solved, its plan: a row of the ``plans`` table, whose columns are these
    fields (:data:`PLANS`)."""

    id: str = column(String(32), primary_key=True)
    created_at: datetime = column(TIMESTAMP, index=True)
    status: str = column(String(16), "pending (plan-ahead, not solved yet), done or failed", index=True)
    request_hash: str = column(String(64))
    n_samples: int = column(Integer, "samples of the batch")
    n_ranks: int = column(Integer, "GPUs of the cluster")
    cluster: str | None = column(String(128), "the cluster preset's name, else the cluster's", default=None)
    model: str | None = column(String(128), "the model preset's name, else the model's", default=None)
    finished_at: datetime | None = column(TIMESTAMP, default=None)
    plan_json: str | None = column(Text, default=None)
    error_json: str | None = column(Text, default=None)
    backend: str | None = column(String(32), "the backend that produced the plan", default=None, index=True)
    solver_status: str | None = column(String(32), default=None)
    predicted_step_time_s: float | None = column(Float, default=None)
    lower_bound_s: float | None = column(Float, default=None)
    gap: float | None = column(Float, default=None)
    solve_ms: float | None = column(Float, "the planner's wall time", default=None)
    request_json: str | None = column(
        Text, "the request document (absent from a record read without its documents)", default=None, nullable=False
    )
    claimed_at: datetime | None = column(
        TIMESTAMP,
        "when the process solving a pending plan took it up: at acceptance, or at the start of a process that "
        "resumed it",
        default=None,
    )
    budget_ms: float | None = column(
        Float, "the time budget the request asked for (the default when it gave none)", default=None
    )
    speedup: float | None = column(Float, "speedup over the best static layout", default=None)
    profile: str | None = column(
        String(200), "'analytical', or the request's profile's source ('given' when it has none)", default=None
    )

    @property
    def error(self) -> dict[str, Any] | None:
        return json.loads(self.error_json) if self.error_json else None


def _columns(record: type) -> list[Column[Any]]:
    hints = get_type_hints(record)
    out = []
    for f in fields(record):
        meta = f.metadata
        nullable = NoneType in get_args(hints[f.name]) if meta["nullable"] is None else meta["nullable"]
        out.append(
            Column(
                f.name,
                meta["sql"],
                primary_key=meta["primary_key"],
                index=meta["index"] or None,
                nullable=nullable,
                doc=meta["doc"],
            )
        )
    return out


PLANS = Table(
    "plans", Base.metadata, *_columns(PlanRecord), Index("ix_plans_request_hash_status", "request_hash", "status")
)
"""The ``plans`` table: a column for each field of :class:`PlanRecord`."""


class PlanRow(Base):
    __table__ = PLANS


class FeedbackRow(Base):
    __tablename__ = "feedback"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    plan_id: Mapped[str] = mapped_column(String(32), ForeignKey("plans.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    measured_step_time_s: Mapped[float] = mapped_column(Float)
    predicted_step_time_s: Mapped[float | None] = mapped_column(Float)
    """The plan's prediction, copied beside the measurement for the tuning dashboard."""
    feedback_json: Mapped[str] = mapped_column(Text)
    """The whole feedback document (per-group times, step number, notes)."""
    idempotency_key: Mapped[str | None] = mapped_column(String(64))
    """The ``Idempotency-Key`` the request carried: a retried POST of the same feedback is stored once."""

    __table_args__ = (Index("ux_feedback_plan_idempotency_key", "plan_id", "idempotency_key", unique=True),)


class ProfileRow(Base):
    """A profile refitted from the measured group times of stored plans (``POST /v1/profiles/fit``): version
    ``version`` of its key (the cluster, model and profile the first plans of its line were made with)."""

    __tablename__ = "profiles"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    """``KEY.vN``: what a request names as ``"profile": "learned:KEY.vN"`` (``learned:KEY`` is the newest)."""
    key: Mapped[str] = mapped_column(String(190), index=True)
    version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    cluster: Mapped[str | None] = mapped_column(String(128))
    model: Mapped[str | None] = mapped_column(String(128))
    base_profile: Mapped[str] = mapped_column(String(200))
    """The label of the profile the measured plans were made with."""
    profile_json: Mapped[str] = mapped_column(Text)
    fit_json: Mapped[str] = mapped_column(Text)
    """The fit's statistics, terms and held-out errors."""
    sources_json: Mapped[str] = mapped_column(Text)
    """Provenance: the plan ids and feedback ids fitted and held out."""

    __table_args__ = (Index("ux_profiles_key_version", "key", "version", unique=True),)
