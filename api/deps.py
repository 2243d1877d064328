"""Shared dependencies of the routes, as typed aliases.

They are coroutines on purpose: FastAPI runs plain functions in a thread pool, a thread hop per
dependency per request, which these trivial look-ups do not need.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import ServiceError
from api.service import PlanningService
from api.settings import Settings
from api.store import Store

_bearer = HTTPBearer(auto_error=False, description="a token from DHP_TOKENS (needed only when the server sets tokens)")


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_store(request: Request) -> Store:
    return request.app.state.store


async def get_service(request: Request) -> PlanningService:
    return request.app.state.service


async def arrival(request: Request) -> float:
    """When the request arrived (perf_counter seconds), set by the outermost middleware."""
    return request.scope.get("dhp.arrival") or 0.0


async def require_token(request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    tokens = request.app.state.settings.token_list
    if not tokens:
        return
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise ServiceError(401, "Unauthorized", "this service needs a bearer token", kind="unauthorized", field="Authorization",
                           hint="send 'Authorization: Bearer <token>' with a token from the server's DHP_TOKENS.",
                           headers={"WWW-Authenticate": "Bearer"})
    given = credentials.credentials.encode()
    if not any(hmac.compare_digest(given, t.encode()) for t in tokens):
        raise ServiceError(401, "Unauthorized", "the bearer token is not valid", kind="unauthorized", field="Authorization",
                           hint="use a token from the server's DHP_TOKENS.", headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
ServiceDep = Annotated[PlanningService, Depends(get_service)]
ArrivalDep = Annotated[float, Depends(arrival)]
