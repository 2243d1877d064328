"""Shared dependencies of the routes, as typed aliases.

They are coroutines on purpose: FastAPI runs plain functions in a thread pool, a thread hop per
dependency per request, which these trivial look-ups do not need.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param

from api.service.planning_service import PlanningService
from api.service.problem_details import ServiceError
from api.service.settings import Settings
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


def token_error(tokens: list[str], authorization: str | None) -> ServiceError | None:
    """The 401 for a request whose ``Authorization`` header carries none of ``tokens`` (None: let it
    through, or no tokens set)."""
    if not tokens:
        return None
    scheme, given = get_authorization_scheme_param(authorization)
    if not authorization or scheme.lower() != "bearer" or not given:
        return ServiceError(
            401,
            "Unauthorized",
            "this service needs a bearer token",
            kind="unauthorized",
            field="Authorization",
            hint="send 'Authorization: Bearer <token>' with a token from the server's DHP_TOKENS.",
            headers={"WWW-Authenticate": "Bearer"},
        )
    presented = given.encode("utf-8", "surrogateescape")
    if not any(hmac.compare_digest(presented, t.encode()) for t in tokens):
        return ServiceError(
            401,
            "Unauthorized",
            "the bearer token is not valid",
            kind="unauthorized",
            field="Authorization",
            hint="use a token from the server's DHP_TOKENS.",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    return None


async def require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """The bearer scheme of /v1 in the OpenAPI document. :class:`api.service.middleware.TokenGate` applies the same rule
    before a body is read; this repeats it for an app mounted without that middleware."""
    error = token_error(request.app.state.settings.token_list, request.headers.get("authorization"))
    if error is not None:
        raise error


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
ServiceDep = Annotated[PlanningService, Depends(get_service)]
ArrivalDep = Annotated[float, Depends(arrival)]
