"""The idempotency key of a feedback request: a retried POST of the same feedback is stored once.

Revision ID: 0005_feedback_idempotency
Revises: 0004_plan_figures
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_feedback_idempotency"
down_revision = "0004_plan_figures"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("feedback", sa.Column("idempotency_key", sa.String(64)))
    op.create_index("ux_feedback_plan_idempotency_key", "feedback", ["plan_id", "idempotency_key"], unique=True)


def downgrade() -> None:
    op.drop_index("ux_feedback_plan_idempotency_key", table_name="feedback")
    with op.batch_alter_table("feedback") as batch:
        batch.drop_column("idempotency_key")
