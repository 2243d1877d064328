"""Apply the schema migrations (Alembic) to a database: ``upgrade(engine)`` brings it to the newest version.

Processes that start together (replicas, worker processes) migrate one at a time: on PostgreSQL under a
transaction-level advisory lock, on SQLite under an exclusive lock of a file beside the database. The
first brings the schema to the newest version; the others then find nothing to do.
"""

from __future__ import annotations

import fcntl
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, text

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


MIGRATION_LOCK = zlib.crc32(b"dhp-planner schema migrations")
"""The PostgreSQL advisory lock key held while migrating."""


@contextmanager
def _sqlite_lock(engine: Engine) -> Iterator[None]:
    database = engine.url.database
    if not database or database == ":memory:":
        yield
        return
    with open(f"{database}.migrate-lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _migrate(engine: Engine, step: Any, revision: str) -> None:
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    if engine.dialect.name == "sqlite":
        with _sqlite_lock(engine), engine.begin() as conn:
            cfg.attributes["connection"] = conn
            step(cfg, revision)
        return
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK}
            )  # released when this transaction ends
        cfg.attributes["connection"] = conn
        step(cfg, revision)


def upgrade(engine: Engine, revision: str = "head") -> None:
    _migrate(engine, command.upgrade, revision)


def downgrade(engine: Engine, revision: str) -> None:
    _migrate(engine, command.downgrade, revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
