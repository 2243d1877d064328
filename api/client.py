"""A client of the planning service for trainers; needs only httpx (``pip install 'dhp-planner[client]'``).

    client = PlannerClient("http://planner:8000", token=..., local_fallback=True)
    plan = client.plan(batch=batch_doc, cluster_preset="h100-8x8", model_preset="qwen2-vl-7b")
    ahead = client.plan_ahead(batch=next_batch_doc, ...)      # plan batch k+1 while batch k trains
    ...
    next_plan = client.result(ahead, wait_ms=5000)
    client.feedback(plan["id"], measured_step_time_s=1.93)

Connection failures, timeouts and 502/503/504 answers are retried with exponential backoff (a 503's
Retry-After is honoured); every try of one POST carries the same ``Idempotency-Key`` header. With
``local_fallback=True``, when the service cannot be reached at all, the plan is made in this process
by the planner's heuristic (deterministic: every rank gets the same plan), so training never stalls; such plans have ``status`` ``local`` and an id
starting with ``local-``; feedback that cannot be delivered is kept (``unsent_feedback``) and sent
before the next feedback, or by :meth:`PlannerClient.flush_feedback`. Errors in the request itself
(4xx), and a plan-ahead request that failed, raise :class:`PlannerServiceError` with the problem
document. The bearer token defaults to the ``DHP_TOKEN`` environment variable.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

import httpx

RETRY_STATUSES = (502, 503, 504)
TOKEN_ENV = "DHP_TOKEN"
UNSENT_FEEDBACK_LIMIT = 10_000
"""Feedback documents kept while the service cannot be reached (the oldest are dropped beyond this)."""


class PlannerServiceError(Exception):
    """The service answered with an error (a problem document: ``status``, ``detail``, ``field``, ``hint``)."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        self.field = problem.get("field")
        self.hint = problem.get("hint")
        text = f"HTTP {status}: {problem.get('title', 'error')}"
        if self.field:
            text += f" at {self.field}"
        if problem.get("detail"):
            text += f": {problem['detail']}"
        if self.hint:
            text += f" To fix: {self.hint}"
        super().__init__(text)


class ServiceUnavailable(Exception):
    """The service could not be reached (or stayed at capacity) after every retry."""


def _request_doc(request: dict[str, Any] | None, parts: dict[str, Any]) -> dict[str, Any]:
    doc = dict(request or {})
    doc.update({k: v for k, v in parts.items() if v is not None})
    if "batch" not in doc:
        raise ValueError("a plan request needs 'batch' (a batch document)")
    return doc


class PlannerClient:
    """Plans over HTTP with retries, and optionally in process when the service is unreachable."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout_s: float = 30.0, retries: int = 4, backoff_s: float = 0.05,
                 max_backoff_s: float = 2.0, local_fallback: bool = False, transport: httpx.BaseTransport | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s, transport=transport)
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.local_fallback = local_fallback
        self._sleep = sleep
        self._local: dict[str, dict[str, Any]] = {}
        self.fallbacks = 0
        """How many plans were made locally because the service was unreachable."""
        self.unsent_feedback: deque[tuple[str, dict[str, Any]]] = deque(maxlen=UNSENT_FEEDBACK_LIMIT)
        """Feedback (plan id, document) not delivered yet because the service could not be reached."""

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PlannerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport --------------------------------------------------------------------------

    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        if response is not None and response.headers.get("Retry-After", "").isdigit():
            return min(float(response.headers["Retry-After"]), self.max_backoff_s * 4)
        base = min(self.max_backoff_s, self.backoff_s * (2 ** attempt))
        return base * (0.5 + random.random() / 2)

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        if method == "POST":  # one key for every try of this call, so that the service can tell a retry from a new request
            kwargs["headers"] = {"Idempotency-Key": uuid.uuid4().hex, **kwargs.get("headers", {})}
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            response = None
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:  # connection refused, reset, timeout
                last = exc
            else:
                if response.status_code not in RETRY_STATUSES:
                    if response.status_code >= 400:
                        try:
                            problem = response.json()
                        except ValueError:
                            problem = {"title": response.reason_phrase, "detail": response.text[:500]}
                        raise PlannerServiceError(response.status_code, problem if isinstance(problem, dict) else {"detail": str(problem)})
                    return response
                last = PlannerServiceError(response.status_code, {"title": response.reason_phrase, "detail": response.text[:500]})
            if attempt < self.retries:
                self._sleep(self._delay(attempt, response))
        raise ServiceUnavailable(f"{method} {path} failed after {self.retries + 1} attempts: {last}")

    # -- planning ---------------------------------------------------------------------------

    def _local_plan(self, doc: dict[str, Any]) -> dict[str, Any]:
        from optimizer.problem.documents import problem_from_json
        from planning.planner import plan

        # Deterministic: every rank falling back plans the same batch into the same plan, whatever its clock says.
        problem = problem_from_json({k: v for k, v in doc.items() if k not in ("wait", "cache")}, overrides={"backend": "heuristic", "deterministic": True})
        out = {"id": f"local-{uuid.uuid4().hex}", "status": "local", "created_at": None, **plan(problem).to_json()}
        self.fallbacks += 1
        return out

    def plan(self, request: dict[str, Any] | None = None, **parts: Any) -> dict[str, Any]:
        """The verified plan for a request (a ``dhp plan`` request document, or its parts as keywords)."""
        doc = _request_doc(request, parts)
        doc["wait"] = True
        try:
            return self._call("POST", "/v1/plans", json=doc).json()
        except ServiceUnavailable:
            if not self.local_fallback:
                raise
            return self._local_plan(doc)

    def plan_ahead(self, request: dict[str, Any] | None = None, **parts: Any) -> str:
        """Submit a request without waiting; returns the plan id to pass to :meth:`result`."""
        doc = _request_doc(request, parts)
        doc["wait"] = False
        try:
            return str(self._call("POST", "/v1/plans", json=doc).json()["id"])
        except ServiceUnavailable:
            if not self.local_fallback:
                raise
            local = self._local_plan(doc)
            self._local[local["id"]] = local
            return str(local["id"])

    def result(self, plan_id: str, wait_ms: int = 10_000) -> dict[str, Any]:
        """The plan with this id, waiting up to ``wait_ms`` while it is pending (``status`` says whether it still is);
        raises :class:`PlannerServiceError` with the plan's problem document when it failed."""
        if plan_id in self._local:
            return self._local.pop(plan_id)
        deadline = time.monotonic() + wait_ms / 1000.0
        while True:
            left = max(0, int((deadline - time.monotonic()) * 1000))
            doc = self._call("GET", f"/v1/plans/{plan_id}", params={"wait_ms": min(left, 30_000)}).json()
            if doc.get("status") == "failed":
                problem = doc.get("error") if isinstance(doc.get("error"), dict) else {"title": "Plan failed", "detail": str(doc.get("error"))}
                raise PlannerServiceError(int(problem.get("status") or 422), problem)
            if doc.get("status") != "pending" or left <= 0:
                return doc

    def feedback(self, plan_id: str, measured_step_time_s: float, *, group_times_s: list[list[float]] | None = None, step: int | None = None,
                 metrics: dict[str, float] | None = None, notes: str | None = None) -> dict[str, Any] | None:
        """Store a measured step time beside the plan's prediction; None for a locally made plan, or when the service
        cannot be reached with ``local_fallback`` (the feedback is then kept in ``unsent_feedback`` and sent later)."""
        if plan_id.startswith("local-"):
            return None
        body: dict[str, Any] = {"measured_step_time_s": measured_step_time_s}
        for key, value in (("group_times_s", group_times_s), ("step", step), ("metrics", metrics), ("notes", notes)):
            if value is not None:
                body[key] = value
        try:
            self.flush_feedback()
            return self._call("POST", f"/v1/plans/{plan_id}/feedback", json=body).json()
        except ServiceUnavailable:
            if self.local_fallback:
                self.unsent_feedback.append((plan_id, body))
                return None
            raise

    def flush_feedback(self) -> int:
        """Send the feedback kept while the service could not be reached; returns how many were delivered.
        Raises :class:`ServiceUnavailable` (keeping the rest) when it still cannot be reached."""
        sent = 0
        while self.unsent_feedback:
            plan_id, body = self.unsent_feedback[0]
            try:
                self._call("POST", f"/v1/plans/{plan_id}/feedback", json=body)
                sent += 1
            except PlannerServiceError:  # refused (e.g. the plan is gone): not worth keeping
                pass
            self.unsent_feedback.popleft()
        return sent

    def presets(self) -> dict[str, Any]:
        return self._call("GET", "/v1/presets").json()

    def healthy(self) -> bool:
        try:
            return self._http.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False
