"""Profiles refitted from measured group times (POST /v1/profiles/fit), one version per key.

Revision ID: 0006_learned_profiles
Revises: 0005_feedback_idempotency
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_learned_profiles"
down_revision = "0005_feedback_idempotency"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "profiles",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("key", sa.String(190), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cluster", sa.String(128)),
        sa.Column("model", sa.String(128)),
        sa.Column("base_profile", sa.String(200), nullable=False),
        sa.Column("profile_json", sa.Text, nullable=False),
        sa.Column("fit_json", sa.Text, nullable=False),
        sa.Column("sources_json", sa.Text, nullable=False),
    )
    op.create_index("ix_profiles_key", "profiles", ["key"])
    op.create_index("ux_profiles_key_version", "profiles", ["key", "version"], unique=True)


def downgrade() -> None:
    op.drop_index("ux_profiles_key_version", table_name="profiles")
    op.drop_index("ix_profiles_key", table_name="profiles")
    op.drop_table("profiles")
