"""ASGI middleware: arrival time, request latency metric, the bearer token, the request body limits (size, bytes held,
time) and the admission pre-check."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from api.service.deps import token_error
from api.service.intake import BodyBudget
from api.service.metrics import Metrics
from api.service.problem_details import ServiceError, error_response, problem_response
from api.service.settings import is_loopback

Scope = dict[str, Any]


class ArrivalAndMetrics:
    """Outermost layer: stamps the arrival time (the budget counts from it), times every request and
    adds that time to the ``Server-Timing`` header as ``app``."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        scope["dhp.arrival"] = start
        status = [500]

        async def send_wrapper(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                # Server-Timing "app": from arrival to the answer's first byte, inside the service.
                app_ms = (time.perf_counter() - start) * 1000.0
                headers = list(message.get("headers", []))
                for k, (name, value) in enumerate(headers):
                    if name.lower() == b"server-timing":
                        headers[k] = (name, value + f", app;dur={app_ms:.3f}".encode())
                        break
                else:
                    headers.append((b"server-timing", f"app;dur={app_ms:.3f}".encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            self.metrics.request_latency.labels(method=scope["method"], route=path, status=str(status[0])).observe(
                time.perf_counter() - start
            )


def _is_v1(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


class TokenGate:
    """Checks the bearer token of every /v1 request before anything else reads its body
    (:func:`api.service.deps.token_error`): a client without a valid token is answered 401 at once and never holds body
    bytes, a waiting place or a parse.

    With ``loopback_only`` (no tokens outside development) a /v1 request that reached the server on an address other
    than loopback is refused with 403, whatever server runs the app and whatever address it was told to bind: the
    connection's own local address says whether other machines can reach it."""

    def __init__(self, app: Any, tokens: list[str], loopback_only: bool = False) -> None:
        self.app = app
        self.tokens = tokens
        self.loopback_only = loopback_only and not tokens

    def _exposed(self, scope: Scope) -> str | None:
        server = scope.get("server")
        host = server[0] if server else None
        return None if host is None or is_loopback(host) else host

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and _is_v1(scope.get("path", "")):
            exc = None
            if self.tokens:
                given = next(
                    (value.decode("latin-1") for name, value in scope.get("headers", ()) if name == b"authorization"),
                    None,
                )
                exc = token_error(self.tokens, given)
            elif self.loopback_only and (host := self._exposed(scope)) is not None:
                exc = ServiceError(
                    403,
                    "Forbidden",
                    f"this service has no bearer tokens and was reached on {host}, which other machines can reach",
                    kind="no-tokens",
                    hint=(
                        "the operator should set DHP_TOKENS (e.g. `openssl rand -hex 24`), or listen on 127.0.0.1 only."
                    ),
                )
            if exc is not None:
                await error_response(exc, scope.get("path"))(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """Refuses request bodies larger than ``max_bytes`` with 413, whether or not Content-Length is given; holds each
    body's bytes in ``budget`` (:class:`api.service.intake.BodyBudget`) as they arrive, until the answer is sent (a body
    that would go over it is refused with 503 and Retry-After); and refuses with 408 a body that has not arrived in full
    within ``timeout_s`` of the request's start. Bytes are held as they arrive, not as declared, so a client that
    declares a large body and stalls holds only what it sent, and only until its time is up."""

    def __init__(self, app: Any, max_bytes: int, budget: BodyBudget, pool: Any, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.budget = budget
        self.pool = pool
        self.timeout_s = timeout_s

    async def _refuse(self, scope: Scope, receive: Any, send: Any, size: str) -> None:
        response = problem_response(
            413,
            "Request body too large",
            f"the body has {size} bytes; this service accepts at most {self.max_bytes}",
            kind="body-too-large",
            field="body",
            hint="split the batch into smaller requests, or raise DHP_MAX_BODY_BYTES on the server.",
            instance=scope.get("path"),
        )
        await response(scope, receive, send)

    async def _busy(self, scope: Scope, receive: Any, send: Any) -> None:
        exc = self.pool.refused(
            f"the request bodies being received fill the {self.budget.max_bytes} bytes set aside for them "
            "(DHP_MAX_BODY_BYTES_IN_FLIGHT)"
        )
        await error_response(exc, scope.get("path"))(scope, receive, send)

    async def _late(self, scope: Scope, receive: Any, send: Any, got: int) -> None:
        await problem_response(
            408,
            "Request body too slow",
            f"the body did not arrive within {self.timeout_s:g} s ({got} bytes came)",
            kind="body-timeout",
            field="body",
            hint=f"send the whole body within {self.timeout_s:g} s, or raise DHP_BODY_TIMEOUT_S on the server.",
            headers={"Connection": "close"},
            instance=scope.get("path"),
        )(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await self._refuse(scope, receive, send, value.decode())
                return
        held = 0
        until = scope.get("dhp.arrival", time.perf_counter()) + self.timeout_s
        try:
            # Read the body here (the route would read it anyway) so a chunked body is limited too.
            chunks: list[bytes] = []
            while True:
                try:
                    message = await asyncio.wait_for(receive(), max(0.0, until - time.perf_counter()))
                except TimeoutError:
                    await self._late(scope, receive, send, held)
                    return
                if message["type"] == "http.disconnect":
                    return
                body = message.get("body", b"")
                if held + len(body) > self.max_bytes:
                    await self._refuse(scope, receive, send, f"more than {self.max_bytes}")
                    return
                if body:
                    if not self.budget.take(len(body)):
                        await self._busy(scope, receive, send)
                        return
                    held += len(body)
                    chunks.append(body)
                if not message.get("more_body", False):
                    break
            data = b"".join(chunks)
            del chunks
            sent = False

            async def replay() -> dict[str, Any]:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": data, "more_body": False}
                return await receive()

            await self.app(scope, replay, send)
        finally:
            if held:
                self.budget.give(held)


class AdmissionPrecheck:
    """Refuses ``POST /v1/plans`` with 503 before its body is read when the solve queue is full, or when the solves
    admitted would keep a request waiting longer than the largest time budget this service grants: an overloaded
    service answers at once instead of receiving and parsing a large body it would refuse anyway."""

    def __init__(self, app: Any, pool: Any, max_budget_s: float) -> None:
        self.app = app
        self.pool = pool
        self.max_budget_s = max_budget_s

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope.get("path") == "/v1/plans":
            exc = None
            if self.pool.full:
                exc = self.pool.refused()
            elif (wait := self.pool.wait_s()) > self.max_budget_s:
                exc = self.pool.refused(
                    f"the solves admitted would keep any request waiting about {wait:.1f} s, "
                    "longer than any time budget here"
                )
            if exc is not None:
                response = error_response(exc, scope.get("path"))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
