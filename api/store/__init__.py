"""The plan store: requests, plans, solver statistics and trainer feedback (SQLAlchemy 2)."""

from api.store.repository import PlanRecord, Store

__all__ = ["PlanRecord", "Store"]
