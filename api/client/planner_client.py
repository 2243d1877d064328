"""Clients of the planning service for trainers, blocking and asyncio; need only httpx
(``pip install 'dhp-planner[client]'``).

    client = PlannerClient("http://planner:8000", token=..., local_fallback=True)
    plan = client.plan(batch=batch_doc, cluster_preset="h100-8x8", model_preset="qwen2-vl-7b")
    ahead = client.plan_ahead(batch=next_batch_doc, ...)      # plan batch k+1 while batch k trains
    ...
    next_plan = client.result(ahead, wait_ms=5000)
    client.feedback(plan["id"], measured_step_time_s=1.93)

    async with AsyncPlannerClient("http://planner:8000") as client:   # the same, awaited
        plan = await client.plan(batch=batch_doc, ...)

Connection failures, timeouts and 502/503/504 answers are retried with exponential backoff (a 503's Retry-After
is honoured); every try of one POST carries the same ``Idempotency-Key`` header. With ``local_fallback=True``,
when the service cannot be reached at all, the plan is made in this process by the planner's heuristic
(deterministic: every rank gets the same plan), so training never stalls; such plans have ``status`` ``local``
and an id starting with ``local-``; feedback that cannot be delivered is kept (``unsent_feedback``) and sent
before the next feedback, or by ``flush_feedback()``. A plan-ahead request that names no budget asks for
``"auto"``: a share of the previous step's time, which the client measured (the trainer's feedback, else the time
between two plan-ahead calls) and sends as ``options.previous_step_s``. Errors in the request itself (4xx), and a
plan-ahead request that failed, raise :class:`PlannerServiceError` with the problem document. The bearer token
defaults to the ``DHP_TOKEN`` environment variable.

Both clients run the same operations (:mod:`api.client.client_core`); only how a request is sent, how a pause is
taken and where the fallback plan is made differ (the asyncio client makes it on a thread).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from api.client.client_core import (
    RETRY_STATUSES,
    TOKEN_ENV,
    UNSENT_FEEDBACK_LIMIT,
    ClientCore,
    PlanLocally,
    PlannerServiceError,
    Send,
    ServiceUnavailable,
    Sleep,
    Step,
    Steps,
    advance,
    auth_headers,
    plan_locally,
)

__all__ = [
    "RETRY_STATUSES",
    "TOKEN_ENV",
    "UNSENT_FEEDBACK_LIMIT",
    "AsyncPlannerClient",
    "PlannerClient",
    "PlannerServiceError",
    "ServiceUnavailable",
]


def _feedback_fields(
    group_times_s: list[list[float]] | None, step: int | None, metrics: dict[str, float] | None, notes: str | None
) -> dict[str, Any]:
    return {"group_times_s": group_times_s, "step": step, "metrics": metrics, "notes": notes}


class PlannerClient(ClientCore):
    """Plans over HTTP with retries, and optionally in process when the service is unreachable (blocking calls)."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        retries: int = 4,
        backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
        local_fallback: bool = False,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(
            retries=retries, backoff_s=backoff_s, max_backoff_s=max_backoff_s, local_fallback=local_fallback
        )
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), headers=auth_headers(token), timeout=timeout_s, transport=transport
        )
        self._sleep = sleep

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PlannerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, steps: Steps) -> Any:
        done, value = advance(steps, None)
        while not done:
            done, value = advance(steps, self._do(value))
        return value

    def _do(self, step: Step) -> Any:
        if isinstance(step, Send):
            try:
                return self._http.request(step.method, step.path, **step.kwargs)
            except httpx.TransportError as exc:  # the operation decides whether to retry
                return exc
        return plan_locally(step.doc) if isinstance(step, PlanLocally) else self._sleep(step.seconds)

    def plan(self, request: dict[str, Any] | None = None, **parts: Any) -> dict[str, Any]:
        """The verified plan for a request (a ``dhp plan`` request document, or its parts as keywords)."""
        return self._run(self._plan(request, parts))  # type: ignore[no-any-return]

    def plan_ahead(self, request: dict[str, Any] | None = None, **parts: Any) -> str:
        """Submit a request without waiting; returns the plan id to pass to :meth:`result`. A request without
        ``options.time_budget_ms`` asks for ``"auto"`` with the step time this client measured (the trainer's
        last ``feedback``, else the time since the previous plan-ahead call) as ``options.previous_step_s``."""
        return self._run(self._plan_ahead(request, parts))  # type: ignore[no-any-return]

    def result(self, plan_id: str, wait_ms: int = 10_000) -> dict[str, Any]:
        """The plan with this id, waiting up to ``wait_ms`` while it is pending (``status`` says whether it still is);
        raises :class:`PlannerServiceError` with the plan's problem document when it failed."""
        return self._run(self._result(plan_id, wait_ms))  # type: ignore[no-any-return]

    def feedback(
        self,
        plan_id: str,
        measured_step_time_s: float,
        *,
        group_times_s: list[list[float]] | None = None,
        step: int | None = None,
        metrics: dict[str, float] | None = None,
        notes: str | None = None,
    ) -> dict[str, Any] | None:
        """Store a measured step time beside the plan's prediction; None for a locally made plan, or when the service
        cannot be reached with ``local_fallback`` (the feedback is then kept in ``unsent_feedback`` and sent later)."""
        return self._run(
            self._feedback(plan_id, measured_step_time_s, _feedback_fields(group_times_s, step, metrics, notes))
        )  # type: ignore[no-any-return]

    def flush_feedback(self) -> int:
        """Send the feedback kept while the service could not be reached; returns how many were delivered.
        Raises :class:`ServiceUnavailable` (keeping the rest) when it still cannot be reached."""
        return self._run(self._flush_feedback())  # type: ignore[no-any-return]

    def presets(self) -> dict[str, Any]:
        return self._run(self._get_json("/v1/presets"))  # type: ignore[no-any-return]

    def healthy(self) -> bool:
        try:
            return self._http.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False


class AsyncPlannerClient(ClientCore):
    """:class:`PlannerClient` for asyncio: the same operations, awaited; the fallback plan is made on a thread."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        retries: int = 4,
        backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
        local_fallback: bool = False,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__(
            retries=retries, backoff_s=backoff_s, max_backoff_s=max_backoff_s, local_fallback=local_fallback
        )
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=auth_headers(token), timeout=timeout_s, transport=transport
        )
        self._sleep = sleep

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncPlannerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self, steps: Steps) -> Any:
        done, value = advance(steps, None)
        while not done:
            done, value = advance(steps, await self._do(value))
        return value

    async def _do(self, step: Step) -> Any:
        if isinstance(step, PlanLocally):
            return await asyncio.to_thread(plan_locally, step.doc)
        if isinstance(step, Sleep):
            return await self._sleep(step.seconds)
        try:
            return await self._http.request(step.method, step.path, **step.kwargs)
        except httpx.TransportError as exc:
            return exc

    async def plan(self, request: dict[str, Any] | None = None, **parts: Any) -> dict[str, Any]:
        """See :meth:`PlannerClient.plan`."""
        return await self._run(self._plan(request, parts))  # type: ignore[no-any-return]

    async def plan_ahead(self, request: dict[str, Any] | None = None, **parts: Any) -> str:
        """See :meth:`PlannerClient.plan_ahead`."""
        return await self._run(self._plan_ahead(request, parts))  # type: ignore[no-any-return]

    async def result(self, plan_id: str, wait_ms: int = 10_000) -> dict[str, Any]:
        """See :meth:`PlannerClient.result`."""
        return await self._run(self._result(plan_id, wait_ms))  # type: ignore[no-any-return]

    async def feedback(
        self,
        plan_id: str,
        measured_step_time_s: float,
        *,
        group_times_s: list[list[float]] | None = None,
        step: int | None = None,
        metrics: dict[str, float] | None = None,
        notes: str | None = None,
    ) -> dict[str, Any] | None:
        """See :meth:`PlannerClient.feedback`."""
        return await self._run(
            self._feedback(plan_id, measured_step_time_s, _feedback_fields(group_times_s, step, metrics, notes))
        )  # type: ignore[no-any-return]

    async def flush_feedback(self) -> int:
        """See :meth:`PlannerClient.flush_feedback`."""
        return await self._run(self._flush_feedback())  # type: ignore[no-any-return]

    async def presets(self) -> dict[str, Any]:
        return await self._run(self._get_json("/v1/presets"))  # type: ignore[no-any-return]

    async def healthy(self) -> bool:
        try:
            return (await self._http.get("/healthz")).status_code == 200
        except httpx.TransportError:
            return False
