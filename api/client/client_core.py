"""What the planning service's clients do, written once for the blocking and the asyncio client (needs only httpx).

Each operation is a generator that yields what it needs done and receives the outcome: :class:`Send` (an HTTP request:
the response, or the :class:`httpx.TransportError` it raised), :class:`Sleep` (a pause before a retry) and
:class:`PlanLocally` (the in-process fallback plan). :class:`api.client.planner_client.PlannerClient` runs these steps
with blocking calls, :class:`api.client.planner_client.AsyncPlannerClient` with awaits; the retries, the ``Retry-After``
rule, the idempotency keys, the error mapping, the fallback and the feedback kept for later are the same code.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import httpx

RETRY_STATUSES = (502, 503, 504)
TOKEN_ENV = "DHP_TOKEN"
UNSENT_FEEDBACK_LIMIT = 10_000
"""Feedback documents kept while the service cannot be reached (the oldest are dropped beyond this)."""
AUTO_BUDGET = "auto"
"""The ``options.time_budget_ms`` a plan-ahead request gets when it gives none: the planner takes a share of
``options.previous_step_s``, the step time the client measured (``optimizer.problem.options.AUTO_BUDGET``)."""


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


@dataclass(frozen=True)
class Send:
    method: str
    path: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class PlanLocally:
    doc: dict[str, Any]


Step = Send | Sleep | PlanLocally
Steps = Generator[Step, Any, Any]
"""An operation: yields steps, receives each one's outcome, returns the operation's result."""


def advance(steps: Steps, outcome: Any) -> tuple[bool, Any]:
    """Give an operation the outcome of its last step: (False, its next step), or (True, its result) once it returns."""
    try:
        return False, steps.send(outcome)
    except StopIteration as done:
        return True, done.value


def request_doc(request: dict[str, Any] | None, parts: dict[str, Any]) -> dict[str, Any]:
    doc = dict(request or {})
    doc.update({k: v for k, v in parts.items() if v is not None})
    if "batch" not in doc:
        raise ValueError("a plan request needs 'batch' (a batch document)")
    return doc


def auth_headers(token: str | None) -> dict[str, str]:
    """The Authorization header for ``token``, else for ``DHP_TOKEN`` from the environment (none without either)."""
    token = token if token is not None else os.environ.get(TOKEN_ENV) or None
    return {"Authorization": f"Bearer {token}"} if token else {}


def plan_locally(doc: dict[str, Any]) -> dict[str, Any]:
    """The heuristic's plan, made in this process; deterministic, so every rank falling back gets the same plan.
    While the client's warm-up (:func:`warm_engine`) still runs, it pauses after its current request
    and the plan loads what it needs within its own budget (:func:`planning.warm.warmed`)."""
    try:
        from optimizer.problem.documents import problem_from_json
        from planning.planner import plan
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"local_fallback plans in this process and needs the engine ({exc.name} is not installed): "
            "pip install 'dhp-planner[engine]', or create the client with local_fallback=False",
            name=exc.name,
        ) from exc

    problem = problem_from_json(
        {k: v for k, v in doc.items() if k not in ("wait", "cache")},
        overrides={"backend": "heuristic", "deterministic": True},
    )
    return {"id": f"local-{uuid.uuid4().hex}", "status": "local", "created_at": None, **plan(problem).to_json()}


def warm_engine() -> str | None:
    """Load the engine's code and compiled kernels in this process (:func:`planning.planner.warm_up`), for
    the plans made locally; None once done, or why not: the engine is not installed (then
    :func:`plan_locally` says what to install) or the warm-up failed (then each kernel loads when first used)."""
    try:
        from planning.planner import warm_up

        warm_up()
    except ModuleNotFoundError as exc:
        return f"the engine is not installed ({exc.name} is missing)"
    except Exception as exc:  # noqa: BLE001 - the local plan works without it, only slower
        return f"{type(exc).__name__}: {exc}"
    return None


def _problem_of(response: httpx.Response) -> dict[str, Any]:
    try:
        problem = response.json()
    except ValueError:
        problem = {"title": response.reason_phrase, "detail": response.text[:500]}
    return problem if isinstance(problem, dict) else {"detail": str(problem)}


class ClientCore:
    """The state and the operations both clients share (see the module docstring)."""

    def __init__(self, *, retries: int, backoff_s: float, max_backoff_s: float, local_fallback: bool) -> None:
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.local_fallback = local_fallback
        self._local: dict[str, dict[str, Any]] = {}
        self.fallbacks = 0
        """How many plans were made locally because the service was unreachable."""
        self.unsent_feedback: deque[tuple[str, dict[str, Any]]] = deque(maxlen=UNSENT_FEEDBACK_LIMIT)
        """Feedback (plan id, document) not delivered yet because the service could not be reached."""
        self.last_ahead_at: float | None = None
        """``time.monotonic()`` of the last plan-ahead request: a trainer asks once a step, so the time between
        two is a step's."""
        self.reported_step_s: float | None = None
        """The step time the trainer reported in feedback since the last plan-ahead request, if any."""
        self.warm_error: str | None = None
        """Why the engine's warm-up did not run or failed (see :func:`warm_engine`), once it has ended."""
        self.warm_thread: threading.Thread | None = None
        """With ``local_fallback``: the thread loading the engine for the local plans, started here so that
        creating the client does not wait for it; a local plan asked for meanwhile pauses it after its current
        request (the warm-up, some hundreds of milliseconds to a few seconds of CPU, shares the interpreter
        with the trainer's threads meanwhile)."""
        if local_fallback:
            self.warm_thread = threading.Thread(target=self._warm, name="dhp-engine-warm-up", daemon=True)
            self.warm_thread.start()

    def _warm(self) -> None:
        self.warm_error = warm_engine()

    def _delay(self, attempt: int, response: httpx.Response | None) -> float:
        if response is not None and response.headers.get("Retry-After", "").isdigit():
            return min(float(response.headers["Retry-After"]), self.max_backoff_s * 4)
        base = min(self.max_backoff_s, self.backoff_s * (2**attempt))
        return base * (0.5 + random.random() / 2)

    def _call(self, method: str, path: str, **kwargs: Any) -> Steps:
        """One request with retries on connection failures, timeouts and 502/503/504 (honouring Retry-After);
        returns the response; raises :class:`PlannerServiceError` on another error,
        :class:`ServiceUnavailable` after the last try."""
        if (
            method == "POST"
        ):  # one key for every try of this call, so that the service can tell a retry from a new request
            kwargs["headers"] = {"Idempotency-Key": uuid.uuid4().hex, **kwargs.get("headers", {})}
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            outcome = yield Send(method, path, kwargs)
            response = outcome if isinstance(outcome, httpx.Response) else None
            if response is None:  # connection refused, reset, timeout
                last = outcome
            elif response.status_code not in RETRY_STATUSES:
                if response.status_code >= 400:
                    raise PlannerServiceError(response.status_code, _problem_of(response))
                return response
            else:
                last = PlannerServiceError(
                    response.status_code, {"title": response.reason_phrase, "detail": response.text[:500]}
                )
            if attempt < self.retries:
                yield Sleep(self._delay(attempt, response))
        raise ServiceUnavailable(f"{method} {path} failed after {self.retries + 1} attempts: {last}")

    def _submit(self, request: dict[str, Any] | None, parts: dict[str, Any], wait: bool) -> Steps:
        """POST /v1/plans; the answer, or the plan made here when the service cannot be reached
        (with ``local_fallback``)."""
        doc = request_doc(request, parts)
        doc["wait"] = wait
        try:
            return (yield from self._call("POST", "/v1/plans", json=doc)).json()
        except ServiceUnavailable:
            if not self.local_fallback:
                raise
            local = yield PlanLocally(doc)
            self.fallbacks += 1
            return local

    def _plan(self, request: dict[str, Any] | None, parts: dict[str, Any]) -> Steps:
        return (yield from self._submit(request, parts, True))

    def step_time_s(self, now: float) -> float | None:
        """The previous step's time as this client knows it at ``now`` (``time.monotonic()``): the trainer's
        report (``feedback``) since the last plan-ahead request, else the time since that request; None before
        the first one."""
        if self.reported_step_s is not None:
            return self.reported_step_s
        return None if self.last_ahead_at is None else now - self.last_ahead_at

    def _plan_ahead(self, request: dict[str, Any] | None, parts: dict[str, Any]) -> Steps:
        """POST a plan-ahead request. Without a budget of its own it asks for ``"auto"``, with the step time
        measured here (:meth:`step_time_s`) as ``previous_step_s`` unless the request gives one: the planner
        then takes a share of the step the plan is made during."""
        doc = request_doc(request, parts)
        now = time.monotonic()
        options = dict(doc.get("options") or {})
        options.setdefault("time_budget_ms", AUTO_BUDGET)
        step_s = self.step_time_s(now)
        if options["time_budget_ms"] == AUTO_BUDGET and options.get("previous_step_s") is None and step_s:
            options["previous_step_s"] = max(round(step_s, 3), 0.001)  # whole ms: a step's time, not its noise
        doc["options"] = options
        self.last_ahead_at, self.reported_step_s = now, None
        answer = yield from self._submit(doc, {}, False)
        if answer.get("status") == "local":
            self._local[answer["id"]] = answer
        return str(answer["id"])

    def _result(self, plan_id: str, wait_ms: int) -> Steps:
        if plan_id in self._local:
            return self._local.pop(plan_id)
        deadline = time.monotonic() + wait_ms / 1000.0
        while True:
            left = max(0, int((deadline - time.monotonic()) * 1000))
            doc = (yield from self._call("GET", f"/v1/plans/{plan_id}", params={"wait_ms": min(left, 30_000)})).json()
            if doc.get("status") == "failed":
                problem = (
                    doc.get("error")
                    if isinstance(doc.get("error"), dict)
                    else {"title": "Plan failed", "detail": str(doc.get("error"))}
                )
                raise PlannerServiceError(int(problem.get("status") or 422), problem)
            if doc.get("status") != "pending" or left <= 0:
                return doc

    def _feedback(self, plan_id: str, measured_step_time_s: float, extra: dict[str, Any]) -> Steps:
        self.reported_step_s = measured_step_time_s  # the next plan-ahead request's previous step
        if plan_id.startswith("local-"):
            return None
        body: dict[str, Any] = {
            "measured_step_time_s": measured_step_time_s,
            **{k: v for k, v in extra.items() if v is not None},
        }
        try:
            yield from self._flush_feedback()
            return (yield from self._call("POST", f"/v1/plans/{plan_id}/feedback", json=body)).json()
        except ServiceUnavailable:
            if self.local_fallback:
                self.unsent_feedback.append((plan_id, body))
                return None
            raise

    def _flush_feedback(self) -> Steps:
        sent = 0
        while self.unsent_feedback:
            plan_id, body = self.unsent_feedback[0]
            try:
                yield from self._call("POST", f"/v1/plans/{plan_id}/feedback", json=body)
                sent += 1
            except PlannerServiceError:  # refused (e.g. the plan is gone): not worth keeping
                pass
            self.unsent_feedback.popleft()
        return sent

    def _get_json(self, path: str) -> Steps:
        return (yield from self._call("GET", path)).json()
