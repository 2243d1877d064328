"""Alembic environment: runs the migrations on the connection ``api.store.migrate`` hands over.

``api.store.migrate`` serialises concurrent upgrades (several replicas starting at once) with a lock held
until the migration's transaction commits.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from api.store.models import Base


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection, target_metadata=Base.metadata, render_as_batch=connection.dialect.name == "sqlite"
    )
    with context.begin_transaction():
        context.run_migrations()


config = context.config
connection = config.attributes.get("connection")
if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=Base.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif connection is not None:
    _run(connection)
else:
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()
