"""ASGI middleware: arrival time, request latency metric, the request body size limit and budget, and the admission pre-check."""

from __future__ import annotations

import time
from typing import Any

from api.errors import problem_response
from api.intake import BodyBudget
from api.metrics import Metrics

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
            self.metrics.request_latency.labels(method=scope["method"], route=path, status=str(status[0])).observe(time.perf_counter() - start)


class BodyLimit:
    """Refuses request bodies larger than ``max_bytes`` with 413, whether or not Content-Length is given, and holds
    each body's bytes in ``budget`` (:class:`api.intake.BodyBudget`) from its first byte until the answer is sent:
    a body that would go over it is refused with 503 and Retry-After, before it is read when its length is declared."""

    def __init__(self, app: Any, max_bytes: int, budget: BodyBudget, pool: Any) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.budget = budget
        self.pool = pool

    async def _refuse(self, scope: Scope, receive: Any, send: Any, size: str) -> None:
        response = problem_response(413, "Request body too large", f"the body has {size} bytes; this service accepts at most {self.max_bytes}",
                                    kind="body-too-large", field="body",
                                    hint="split the batch into smaller requests, or raise DHP_MAX_BODY_BYTES on the server.",
                                    instance=scope.get("path"))
        await response(scope, receive, send)

    async def _busy(self, scope: Scope, receive: Any, send: Any) -> None:
        exc = self.pool.refused(f"the request bodies being handled fill the {self.budget.max_bytes} bytes set aside for them (DHP_MAX_BODY_BYTES_IN_FLIGHT)")
        await problem_response(exc.status, exc.title, exc.detail, kind=exc.kind, hint=exc.hint, headers=exc.headers, instance=scope.get("path"))(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        declared = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = None
                if declared is not None and declared > self.max_bytes:
                    await self._refuse(scope, receive, send, str(declared))
                    return
        held = 0
        try:
            if declared:
                if not self.budget.take(declared):
                    await self._busy(scope, receive, send)
                    return
                held = declared
            # Read the body here (the route would read it anyway) so a chunked body is limited too.
            chunks: list[bytes] = []
            total = 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body = message.get("body", b"")
                total += len(body)
                if total > self.max_bytes:
                    await self._refuse(scope, receive, send, f"more than {self.max_bytes}")
                    return
                if total > held:
                    if not self.budget.take(total - held):
                        await self._busy(scope, receive, send)
                        return
                    held = total
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
                exc = self.pool.refused(f"the solves admitted would keep any request waiting about {wait:.1f} s, longer than any time budget here")
            if exc is not None:
                response = problem_response(exc.status, exc.title, exc.detail, kind=exc.kind, hint=exc.hint, headers=exc.headers, instance=scope.get("path"))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
