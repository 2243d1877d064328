"""Plans and feedback.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "plans",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("request_json", sa.Text(), nullable=False),
        sa.Column("plan_json", sa.Text()),
        sa.Column("error_json", sa.Text()),
        sa.Column("cluster", sa.String(128)),
        sa.Column("model", sa.String(128)),
        sa.Column("n_samples", sa.Integer(), nullable=False),
        sa.Column("n_ranks", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(32)),
        sa.Column("solver_status", sa.String(32)),
        sa.Column("predicted_step_time_s", sa.Float()),
        sa.Column("lower_bound_s", sa.Float()),
        sa.Column("gap", sa.Float()),
        sa.Column("solve_ms", sa.Float()),
    )
    op.create_index("ix_plans_created_at", "plans", ["created_at"])
    op.create_index("ix_plans_status", "plans", ["status"])
    op.create_index("ix_plans_backend", "plans", ["backend"])
    op.create_index("ix_plans_request_hash_status", "plans", ["request_hash", "status"])
    op.create_table(
        "feedback",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("plan_id", sa.String(32), sa.ForeignKey("plans.id", ondelete="CASCADE"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("measured_step_time_s", sa.Float(), nullable=False),
        sa.Column("predicted_step_time_s", sa.Float()),
        sa.Column("feedback_json", sa.Text(), nullable=False),
    )
    op.create_index("ix_feedback_plan_id", "feedback", ["plan_id"])


def downgrade() -> None:
    op.drop_index("ix_feedback_plan_id", table_name="feedback")
    op.drop_table("feedback")
    for name in ("ix_plans_request_hash_status", "ix_plans_backend", "ix_plans_status", "ix_plans_created_at"):
        op.drop_index(name, table_name="plans")
    op.drop_table("plans")
