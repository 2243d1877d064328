"""When a process took up a pending plan-ahead request (at its start, for requests its predecessor left pending).

Revision ID: 0003_plan_claims
Revises: 0002_jobs
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_plan_claims"
down_revision = "0002_jobs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("plans", sa.Column("claimed_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    with op.batch_alter_table("plans") as batch:
        batch.drop_column("claimed_at")
