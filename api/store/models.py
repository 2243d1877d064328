"""Tables of the plan store. Changes to them go with a migration in ``api/store/migrations/versions``.

Documents (the normalised request, the plan, solver statistics) are kept as JSON text: the plan
text is exactly the body the service returns, so reading a plan back costs no re-encoding, and the
same column type works on SQLite and PostgreSQL.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class PlanRow(Base):
    __tablename__ = "plans"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(16), index=True)
    """``pending`` (plan-ahead, not solved yet), ``done`` or ``failed``."""
    request_hash: Mapped[str] = mapped_column(String(64))
    request_json: Mapped[str] = mapped_column(Text)
    plan_json: Mapped[str | None] = mapped_column(Text)
    error_json: Mapped[str | None] = mapped_column(Text)
    cluster: Mapped[str | None] = mapped_column(String(128))
    model: Mapped[str | None] = mapped_column(String(128))
    n_samples: Mapped[int] = mapped_column(Integer)
    n_ranks: Mapped[int] = mapped_column(Integer)
    backend: Mapped[str | None] = mapped_column(String(32), index=True)
    solver_status: Mapped[str | None] = mapped_column(String(32))
    predicted_step_time_s: Mapped[float | None] = mapped_column(Float)
    lower_bound_s: Mapped[float | None] = mapped_column(Float)
    gap: Mapped[float | None] = mapped_column(Float)
    solve_ms: Mapped[float | None] = mapped_column(Float)
    claimed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    budget_ms: Mapped[float | None] = mapped_column(Float)
    """The time budget the request asked for (the planner's default when it gave none); from the request."""
    speedup: Mapped[float | None] = mapped_column(Float)
    """Speedup of the plan over the best static layout; from the plan."""
    profile: Mapped[str | None] = mapped_column(String(200))
    """``analytical``, or the request's profile's ``source`` (``given`` when it has none)."""
    """When the process solving a pending plan took it up: at acceptance, or at the start of a process that resumed it."""

    __table_args__ = (Index("ix_plans_request_hash_status", "request_hash", "status"),)


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
