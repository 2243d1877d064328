"""The trainers' client of the planning service.

It needs only httpx (``pip install 'dhp-planner[client]'``); planning locally when the service is
down (``local_fallback``) needs the engine as well, and says so when it is missing.
"""

from api.client.client_core import PlannerServiceError, ServiceUnavailable
from api.client.planner_client import AsyncPlannerClient, PlannerClient

__all__ = ["AsyncPlannerClient", "PlannerClient", "PlannerServiceError", "ServiceUnavailable"]
