"""Alembic migrations of the plan store; ``api.store.migrate.upgrade`` applies them."""
