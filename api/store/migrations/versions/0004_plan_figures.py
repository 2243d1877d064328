"""Columns for the figures the plan list and the dashboard sort and filter on (requested budget, speedup over the
static layout, profile label), filled for the plans already stored from their documents.

Revision ID: 0004_plan_figures
Revises: 0003_plan_claims
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from api.store.repository import document_columns

revision = "0004_plan_figures"
down_revision = "0003_plan_claims"
branch_labels = None
depends_on = None

BATCH = 500


def upgrade() -> None:
    op.add_column("plans", sa.Column("budget_ms", sa.Float()))
    op.add_column("plans", sa.Column("speedup", sa.Float()))
    op.add_column("plans", sa.Column("profile", sa.String(200)))
    plans = sa.table(
        "plans",
        sa.column("id", sa.String),
        sa.column("request_json", sa.Text),
        sa.column("plan_json", sa.Text),
        sa.column("budget_ms", sa.Float),
        sa.column("speedup", sa.Float),
        sa.column("profile", sa.String),
    )
    conn = op.get_bind()
    last = ""
    while True:
        rows = conn.execute(
            sa.select(plans.c.id, plans.c.request_json, plans.c.plan_json)
            .where(plans.c.id > last)
            .order_by(plans.c.id)
            .limit(BATCH)
        ).all()
        if not rows:
            break
        for plan_id, request_json, plan_json in rows:
            conn.execute(
                plans.update().where(plans.c.id == plan_id).values(**document_columns(request_json, plan_json))
            )
        last = rows[-1][0]


def downgrade() -> None:
    with op.batch_alter_table("plans") as batch:
        batch.drop_column("profile")
        batch.drop_column("speedup")
        batch.drop_column("budget_ms")
