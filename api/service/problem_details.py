"""Every error as an RFC 9457 problem document (``application/problem+json``), in one place.

Body members: ``type``, ``title``, ``status``, ``detail``, and where known ``field`` (the path of
the request field at fault, e.g. ``batch.samples[3].text_tokens``) and ``hint`` (how to fix it).
Domain errors map as follows: ``ProblemError`` -> 422; ``InfeasibleError`` -> 422 too (the request
is well-formed and understood but cannot be satisfied; 409 would suggest a conflict with the
server's state, which it is not), with type ``.../infeasible``; any other planning failure (no plan
found within the budget, infeasibility not proven) -> 422 ``.../no-plan-found``; a plan that fails
its own verification -> 500 (:func:`planner_error_document`, used for answers and stored
plan-ahead failures alike).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse
from starlette.routing import Match

from optimizer.errors import InfeasibleError, PlannerError, ProblemError, VerificationError

PROBLEM_JSON = "application/problem+json"
TYPE_BASE = "https://dhp-planner.dev/problems/"
log = logging.getLogger("api")


class ServiceError(Exception):
    """An error the service raises on purpose, with its HTTP status."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str,
        *,
        kind: str,
        field: str | None = None,
        hint: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail, self.kind = status, title, detail, kind
        self.field, self.hint, self.headers = field, hint, dict(headers or {})


class Overloaded(ServiceError):
    def __init__(self, retry_after_s: int, detail: str | None = None) -> None:
        super().__init__(
            503,
            "Service at capacity",
            detail or "every solve worker is busy and the waiting line is full",
            kind="overloaded",
            hint=f"retry after {retry_after_s} s, or run more workers (DHP_SOLVE_WORKERS, dhp serve --workers).",
            headers={"Retry-After": str(retry_after_s)},
        )


class StoreUnavailable(Exception):
    """The plan store did not answer (after retries)."""


STORE_DOWN = (OperationalError, InterfaceError, PoolTimeout, StoreUnavailable)
"""Errors of a store that does not answer (server down, connection lost, pool exhausted, SQLite
locked): 503, not 500."""


def problem_document(
    status: int,
    title: str,
    detail: str,
    *,
    kind: str,
    field: str | None = None,
    hint: str | None = None,
    instance: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"type": TYPE_BASE + kind, "title": title, "status": status, "detail": detail}
    if field:
        body["field"] = field
    if hint:
        body["hint"] = hint
    if instance:
        body["instance"] = instance
    return body


def problem_response(
    status: int,
    title: str,
    detail: str,
    *,
    kind: str,
    field: str | None = None,
    hint: str | None = None,
    headers: Mapping[str, str] | None = None,
    instance: str | None = None,
) -> JSONResponse:
    body = problem_document(status, title, detail, kind=kind, field=field, hint=hint, instance=instance)
    return JSONResponse(body, status_code=status, headers=dict(headers or {}), media_type=PROBLEM_JSON)


def error_response(exc: ServiceError, instance: str | None = None) -> JSONResponse:
    """The problem+json answer of a :class:`ServiceError`."""
    return problem_response(
        exc.status,
        exc.title,
        exc.detail,
        kind=exc.kind,
        field=exc.field,
        hint=exc.hint,
        headers=exc.headers,
        instance=instance,
    )


def planner_error_document(exc: PlannerError, instance: str | None = None) -> dict[str, Any]:
    """The problem document of a planning failure, the same whether the plan was asked for now or
    ahead of time: bad input and an unsatisfiable or unplannable request are the caller's to fix
    (422); a plan that fails its own verification is the service's fault (500)."""
    if isinstance(exc, InfeasibleError):
        status, title, kind = 422, "No plan satisfies the request", "infeasible"
    elif isinstance(exc, ProblemError):
        status, title, kind = 422, "Invalid planning request", "invalid-request"
    elif isinstance(exc, VerificationError):
        status, title, kind = 500, "Plan failed verification", "verification-failed"
    else:
        status, title, kind = 422, "No plan found", "no-plan-found"
    return problem_document(status, title, exc.message, kind=kind, field=exc.field, hint=exc.hint, instance=instance)


def planner_error_response(exc: PlannerError, instance: str | None = None) -> JSONResponse:
    body = planner_error_document(exc, instance)
    return JSONResponse(body, status_code=body["status"], media_type=PROBLEM_JSON)


def _loc_to_field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [p for p in loc if p not in ("body", "query", "path", "header")]
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p)
    return out or "body"


_STATUS_TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    406: "Not acceptable",
    413: "Request body too large",
    415: "Unsupported media type",
    429: "Too many requests",
}
_STATUS_HINTS = {
    404: "see /docs for the endpoints; plan ids come from POST /v1/plans.",
    405: "see /docs for the methods each endpoint accepts.",
}


def allowed_methods(request: Request) -> list[str]:
    """The methods some route of the app answers on this request's path."""
    return [
        method
        for method in ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")
        if any(
            route.matches({**request.scope, "method": method})[0] == Match.FULL for route in request.app.router.routes
        )
    ]


_TYPE_HINTS = {
    "bool_type": "give true or false (a JSON boolean, not a string or a number)",
    "int_type": "give a JSON integer (not a string)",
    "int_from_float": "give a whole number",
    "float_type": "give a JSON number (not a string)",
    "finite_number": "give a finite number",
    "string_type": "give a JSON string",
    "dict_type": "give a JSON object",
    "model_type": "give a JSON object",
    "model_attributes_type": "give a JSON object",
    "list_type": "give a JSON array",
    "missing": "add the field",
    "extra_forbidden": "remove the field (it is not part of this request)",
    "json_invalid": "send valid JSON (the detail gives the position)",
}


def validation_hint(error: Mapping[str, Any]) -> str:
    """How to fix one of pydantic's validation errors, from its type and context."""
    kind, ctx = str(error.get("type", "")), error.get("ctx") or {}
    if ctx.get("hint"):  # the field definition's own (a value neither form of a two-form field takes)
        hint = str(ctx["hint"]).rstrip(".")
    elif kind == "literal_error" and ctx.get("expected"):
        hint = f"use one of {ctx['expected']}"
    elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal") and ctx:
        bound = next(iter(ctx.values()))
        words = dict(
            greater_than="above", greater_than_equal="of at least", less_than="below", less_than_equal="of at most"
        )
        hint = f"give a number {words[kind]} {bound}"
    elif kind in ("string_too_long", "too_long") and ctx.get("max_length") is not None:
        hint = f"give at most {ctx['max_length']} {'characters' if kind == 'string_too_long' else 'items'}"
    elif kind == "string_pattern_mismatch":
        hint = "use printable characters only"
    else:
        hint = _TYPE_HINTS.get(kind, "fix the field named")
    return f"{hint}; see /docs for the request schema."


def install(app: FastAPI) -> None:
    """Register the handlers that turn every error into problem+json."""

    @app.exception_handler(ServiceError)
    async def _service(request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc, request.url.path)

    @app.exception_handler(PlannerError)
    async def _planner(request: Request, exc: PlannerError) -> JSONResponse:
        return planner_error_response(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
        field = _loc_to_field(tuple(first.get("loc", ())))
        detail = f"{field}: {first.get('msg', 'invalid')}"
        if len(errors) > 1:
            detail += f" (and {len(errors) - 1} more)"
        return problem_response(
            422,
            "Invalid request",
            detail,
            kind="invalid-request",
            field=field,
            hint=validation_hint(first),
            instance=request.url.path,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # a body that cannot be parsed: bad input like any other, 422 (as malformed JSON is)
            detail = exc.detail if isinstance(exc.detail, str) else "the body cannot be parsed"
            return problem_response(
                422,
                "Invalid request",
                detail,
                kind="invalid-request",
                field="body",
                hint="send a JSON body with content-type application/json; see /docs.",
                instance=request.url.path,
            )
        title = _STATUS_TITLES.get(exc.status_code, "HTTP error")
        detail = exc.detail if isinstance(exc.detail, str) else title
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:  # every method of the path, not only those of the first route that matched it
            headers["Allow"] = ", ".join(allowed_methods(request))
        return problem_response(
            exc.status_code,
            title,
            detail,
            kind=f"http-{exc.status_code}",
            hint=_STATUS_HINTS.get(exc.status_code),
            headers=headers,
            instance=request.url.path,
        )

    async def _store_down(request: Request, exc: Exception) -> JSONResponse:
        log.warning(
            "plan store unavailable on %s %s: %s",
            request.method,
            request.url.path,
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
        )
        retry = str(getattr(request.app.state, "settings", None) and request.app.state.settings.retry_after_s or 1)
        return problem_response(
            503,
            "Store unavailable",
            "the plan store does not answer",
            kind="store-unavailable",
            hint=f"retry after {retry} s; the operator should check the database (GET /readyz).",
            headers={"Retry-After": retry},
            instance=request.url.path,
        )

    for kind in STORE_DOWN:
        app.add_exception_handler(kind, _store_down)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return problem_response(
            500,
            "Internal error",
            f"{type(exc).__name__} while handling the request",
            kind="internal",
            hint="this is a bug in the service; the log has the traceback.",
            instance=request.url.path,
        )
