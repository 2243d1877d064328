"""The planning service: validate, look up the cache, solve off the event loop within the budget, store.

Admission (:mod:`api.admission`) bounds the solves running and waiting; the plan cache
(:mod:`api.plan_cache`) answers repeated requests. The time budget of a request counts from its
arrival (one :class:`planning.deadline.Deadline`), and exact solvers get at most ``solver_threads``
threads each.

Plan-ahead: the request is validated and stored as ``pending`` before the answer (202) is sent,
then solved in the background; the result replaces the pending record, and long-polls waiting on
it in this process are woken.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime
from typing import Any, TypeVar

from api import translate
from api.admission import SolvePool
from api.errors import STORE_DOWN, ServiceError, StoreUnavailable, planner_error_document
from api.metrics import Metrics
from api.plan_cache import Flight, InFlight, PlanCache
from api.settings import Settings
from api.store.repository import PlanRecord, Store, plan_speedup, request_columns, solved_columns, utcnow
from optimizer.errors import PlannerError
from optimizer.gc_pause import collector_paused
from planning.deadline import Deadline
from planning.planner import plan as run_planner

T = TypeVar("T")
log = logging.getLogger("api.service")


LOST = {"type": "https://dhp-planner.dev/problems/lost", "title": "Plan lost", "status": 503,
        "detail": "the server that accepted this plan-ahead request stopped before solving it", "hint": "submit the request again."}
MIN_BUDGET_SHARE = 0.1
"""A request that the waiting line would leave with less than this share of its time budget is refused (503) rather than solved in a hurry."""
INTERNAL = {"type": "https://dhp-planner.dev/problems/internal", "title": "Internal error", "status": 500, "detail": "the solve failed; the log has why"}


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop has closed (shutdown); nobody is waiting any more
        pass


class PlanningService:
    """Validate, look up the cache, solve within the budget, store; for now or ahead of time."""

    def __init__(self, settings: Settings, store: Store, metrics: Metrics) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.pool = SolvePool(settings.solve_workers, settings.queue_limit, settings.retry_after_s, metrics, nice=settings.solve_nice)
        self.cache = PlanCache(settings.plan_cache_size)
        self.flights = InFlight()
        self.resumed = threading.Event()
        """Set once the plan-ahead requests left pending by an earlier process have been taken up (at start-up)."""
        self._waiters: dict[str, asyncio.Event] = {}
        self._asked: dict[str, asyncio.Future[Any]] = {}
        self._accepting: dict[str, asyncio.Future[Any]] = {}

    # -- in a solve thread ------------------------------------------------------------------

    def _prepare(self, doc: dict[str, Any], use_cache: bool, raw: str | None = None) -> tuple[Any, str, PlanRecord | None, str | None]:
        """Validate and look up the plan cache. A request seen before in exactly the same form
        (same documents, key order aside) skips validation: it passed before under the same settings."""
        caching = use_cache and self.settings.plan_cache_size > 0
        if caching and raw is None:
            raw = translate.raw_hash(doc)
        if caching and raw is not None:
            hit = self.cache.get_raw(raw)
            if hit is not None:
                self.metrics.cache_hits.inc()
                return None, hit.request_hash, hit, raw
        try:
            with collector_paused():  # tens of thousands of new sample objects, no reference cycles
                problem = translate.to_problem(doc, self.settings)
        except PlannerError as exc:
            self.metrics.failures.labels(kind=type(exc).__name__).inc()
            raise
        key = translate.request_hash(doc, problem)
        hit = None
        if caching:
            hit = self.cache.get(key) or self.store.find_done(key)
            if hit is not None:
                self.metrics.cache_hits.inc()
                self.cache.put(key, hit, raw if caching else None)
        return problem, key, hit, raw if caching else None

    def _solve(self, problem: Any, arrival: float) -> tuple[Any, str, float]:
        """The plan, its text, and the planner's own time in this call (ms)."""
        # The budget counts from the request's arrival: queueing and validation are part of it.
        deadline = Deadline.after_ms(problem.options.time_budget_ms, start=arrival)
        began = time.perf_counter()
        try:
            result = run_planner(problem, deadline=deadline)
        except PlannerError as exc:
            self.metrics.failures.labels(kind=type(exc).__name__).inc()
            raise
        solve_ms = (time.perf_counter() - began) * 1000.0
        stats = result.solver
        self.metrics.solve_latency.labels(backend=stats.backend).observe(stats.wall_ms / 1000.0)
        self.metrics.gap.labels(backend=stats.backend).observe(result.gap)
        if stats.fallback_reason:
            self.metrics.fallbacks.labels(backend=stats.backend).inc()
        return result, translate.plan_text(result, len(problem.batch)), solve_ms

    def _record(self, plan_id: str, doc: dict[str, Any], problem: Any, key: str, status: str, result: Any = None, text: str | None = None) -> PlanRecord:
        cluster, model = translate.names(doc, problem)
        base = dict(id=plan_id, created_at=utcnow(), status=status, request_hash=key, n_samples=len(problem.batch), n_ranks=problem.cluster.total_gpus,
                    cluster=cluster, model=model, request_json=translate.request_text(doc), **request_columns(doc))
        if result is not None:
            base.update(finished_at=base["created_at"], plan_json=text, speedup=plan_speedup(result), **solved_columns(result))
        else:
            base.update(claimed_at=base["created_at"])
        return PlanRecord(**base)

    def _follow(self, flight: Flight) -> PlanRecord:
        """The plan of an identical request being solved now (its error, if it fails)."""
        try:
            return flight.done.result(timeout=self.settings.stale_after_s)
        except FutureTimeout:
            raise ServiceError(503, "Plan not ready", "an identical request is still being solved", kind="overloaded",
                               hint=f"retry after {self.settings.retry_after_s} s.", headers={"Retry-After": str(self.settings.retry_after_s)}) from None

    def plan_now(self, doc: dict[str, Any], arrival: float, use_cache: bool, raw: str | None = None) -> tuple[PlanRecord, bool, dict[str, float]]:
        """Solve in this thread; also returns where the time went (ms), for the Server-Timing header.
        An identical request being solved already (same request hash) is waited for instead: one solve, one plan."""
        t0 = time.perf_counter()
        timings = {"queue": (t0 - arrival) * 1000.0}
        problem, key, hit, raw = self._prepare(doc, use_cache, raw)
        t1 = time.perf_counter()
        timings["translate"] = (t1 - t0) * 1000.0
        if hit is not None:
            timings["done_at"] = time.perf_counter()
            return hit, True, timings
        flight, lead = self.flights.claim(key) if use_cache else (None, True)
        if flight is not None and not lead:
            record = self._follow(flight)
            timings["shared"] = (time.perf_counter() - t1) * 1000.0
            timings["done_at"] = time.perf_counter()
            return record, True, timings
        try:
            result, text, solve_ms = self._solve(problem, arrival)
            t2 = time.perf_counter()
            timings["solve"] = solve_ms
            timings["encode"] = (t2 - t1) * 1000.0 - solve_ms
            record = self._record(uuid.uuid4().hex, doc, problem, key, "done", result, text)
            self.store.add(record)
        except BaseException as exc:
            if flight is not None:
                self.flights.land(key, flight, error=exc)
            raise
        self.cache.put(key, record, raw)
        if flight is not None:
            self.flights.land(key, flight, record)
        timings["store"] = (time.perf_counter() - t2) * 1000.0
        timings["done_at"] = time.perf_counter()
        return record, False, timings

    def _accept_ahead(self, plan_id: str, doc: dict[str, Any], use_cache: bool, raw: str | None) -> tuple[PlanRecord, bool, Any]:
        """Validate, look up the cache and store the request as pending (not on a solve worker: the answer does not wait
        for one). Returns the record to answer with, whether it was cached, and what the solve needs (None: nothing to solve)."""
        flight: Flight | None = None
        lead = True
        key = ""
        try:
            problem, key, hit, raw = self._prepare(doc, use_cache, raw)
            if hit is not None:
                return hit, True, None
            pending = self._record(plan_id, doc, problem, key, "pending")
            if use_cache:
                flight, lead = self.flights.claim(key, pending)
                if not lead and flight.pending is not None:
                    return flight.pending, False, None  # an identical plan-ahead request is being solved: its id, its plan
            self.store.add(pending)
        except BaseException as exc:
            if flight is not None and lead:
                self.flights.land(key, flight, error=exc)
            raise
        return pending, False, (problem, key, raw, flight, lead, pending)

    def _solve_ahead(self, plan_id: str, context: Any, arrival: float, loop: asyncio.AbstractEventLoop) -> None:
        """Solve an accepted plan-ahead request on a solve worker and store the answer; long-polls in this process are woken."""
        problem, key, raw, flight, lead, pending = context
        if flight is not None and not lead:  # a request that waits for its plan is solving it: this record takes that plan
            self._finish_from(plan_id, flight, loop)
            return
        record: PlanRecord | None = None
        error: BaseException | None = None
        try:
            record, error = self._solve_pending(plan_id, problem, arrival, pending)
            if record is not None:
                self.cache.put(key, record, raw)
        finally:
            if flight is not None:
                self.flights.land(key, flight, record, None if record is not None else error or StoreUnavailable("the solve ended without a plan"))
            _call_soon(loop, self._wake, plan_id)

    def _solve_pending(self, plan_id: str, problem: Any, arrival: float, pending: PlanRecord) -> tuple[PlanRecord | None, BaseException | None]:
        """Solve a pending plan and store the answer (retried while the store is down); the stored record or the error."""
        try:
            result, text, _ = self._solve(problem, arrival)
        except PlannerError as exc:
            self._write(self.store.fail, plan_id, planner_error_document(exc))
            return None, exc
        except Exception as exc:
            log.exception("plan-ahead solve %s failed", plan_id)
            self._write(self.store.fail, plan_id, INTERNAL)
            return None, exc
        if not self._write(self.store.finish, plan_id, text, result):
            return None, StoreUnavailable("the plan store did not answer")
        return self._write(self.store.get, plan_id) or pending, None

    def _write(self, fn: Callable[..., T], *args: Any) -> T | None:
        """A store call retried with backoff while the store is unreachable, for up to ``store_retry_s``;
        None when it never got through (the plan stays pending: a later start of the service resumes it)."""
        give_up = time.monotonic() + self.settings.store_retry_s
        delay = 0.05
        while True:
            try:
                return fn(*args)
            except STORE_DOWN as exc:
                if time.monotonic() + delay > give_up:
                    log.error("the plan store did not answer for %.0f s (%s); left pending for a later start to resume", self.settings.store_retry_s, exc)
                    return None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _finish_from(self, plan_id: str, flight: Flight, loop: asyncio.AbstractEventLoop) -> None:
        """A pending plan-ahead record finished with the plan of the identical request that was solving already."""
        try:
            self._write(self.store.finish_from, plan_id, self._follow(flight))
        except PlannerError as exc:
            self._write(self.store.fail, plan_id, planner_error_document(exc))
        except Exception:
            log.exception("plan-ahead solve %s failed", plan_id)
            self._write(self.store.fail, plan_id, INTERNAL)
        finally:
            _call_soon(loop, self._wake, plan_id)

    def resume_pending(self, started_at: datetime) -> list[str]:
        """Solve the plan-ahead requests that an earlier process accepted but did not answer (it stopped):
        each is claimed in the store first, so that processes starting together solve it once. Their
        budgets count from now. Returns the ids resumed."""
        resumed = []
        for pending in self.store.claim_pending(started_at):
            try:
                doc = json.loads(pending.request_json or "{}")
                problem = translate.to_problem(doc, self.settings)
            except PlannerError as exc:  # the limits changed since it was accepted
                self._write(self.store.fail, pending.id, planner_error_document(exc))
                continue
            record, _ = self._solve_pending(pending.id, problem, time.perf_counter(), pending)
            if record is not None:
                self.cache.put(pending.request_hash, record)
            resumed.append(pending.id)
        if resumed:
            log.info("resumed %d plan-ahead request(s) left pending by an earlier process", len(resumed))
        return resumed

    # -- on the event loop ------------------------------------------------------------------

    def _wake(self, plan_id: str) -> None:
        event = self._waiters.pop(plan_id, None)
        if event is not None:
            event.set()

    def _shared(self, table: dict[str, asyncio.Future[Any]], raw: str | None, start: Callable[[], Any]) -> tuple[asyncio.Future[Any], bool]:
        """The task answering an identical request (same raw hash) already asked in this process, else a new one;
        and whether it was joined. The task runs to its end even when the request that started it goes away."""
        task = table.get(raw) if raw is not None else None
        if task is not None:
            return task, True
        task = asyncio.ensure_future(start())
        if raw is not None:
            table[raw] = task

            def done(t: asyncio.Future[Any]) -> None:
                if table.get(raw) is t:
                    del table[raw]
                if not t.cancelled():
                    t.exception()  # retrieved here, so an error nobody awaited any more is not logged as lost
            task.add_done_callback(done)
        return task, False

    async def plan(self, doc: dict[str, Any], arrival: float, use_cache: bool = True, raw: str | None = None) -> tuple[PlanRecord, bool, dict[str, float]]:
        """Solve now; returns the stored record, whether it came from the cache (or an identical request
        in flight), and where the time went (``handoff``: from the solve thread's end until this coroutine runs again).
        ``raw`` identifies the request as sent (the body's hash); computed from ``doc`` when not given."""
        raw = (raw or translate.raw_hash(doc)) if use_cache else None
        budget_s = translate.budget_ms(doc) / 1000.0
        task, joined = self._shared(self._asked, raw, lambda: self.pool.run(self.plan_now, doc, arrival, use_cache, raw, deadline=arrival + budget_s,
                                                                            min_left_s=MIN_BUDGET_SHARE * budget_s))
        record, cached, timings = await asyncio.shield(task)
        timings = dict(timings)
        if joined:
            timings = {"queue": timings.get("queue", 0.0), "shared": (time.perf_counter() - arrival) * 1000.0, "done_at": timings["done_at"]}
        timings["handoff"] = (time.perf_counter() - timings.pop("done_at")) * 1000.0
        return record, cached or joined, timings

    async def plan_ahead(self, doc: dict[str, Any], arrival: float, use_cache: bool = True, raw: str | None = None) -> tuple[PlanRecord, bool]:
        """Validate and store as pending, answer, and solve in the background. Identical requests in flight
        get the same pending plan."""
        raw = (raw or translate.raw_hash(doc)) if use_cache else None
        task, _ = self._shared(self._accepting, raw, lambda: self._accept(doc, arrival, use_cache, raw))
        return await asyncio.shield(task)

    async def _accept(self, doc: dict[str, Any], arrival: float, use_cache: bool, raw: str | None) -> tuple[PlanRecord, bool]:
        """A place in the solve queue is taken first (503 at once when full), then the request is validated and stored
        pending off the event loop and answered, without waiting for a free solve worker."""
        loop = asyncio.get_running_loop()
        plan_id = uuid.uuid4().hex
        job = self.pool.reserve(arrival + translate.budget_ms(doc) / 1000.0)
        self._waiters[plan_id] = asyncio.Event()
        try:
            record, cached, context = await asyncio.to_thread(self._accept_ahead, plan_id, doc, use_cache, raw)
        except BaseException:
            self.pool.release(job)
            self._waiters.pop(plan_id, None)
            raise
        if context is None:
            self.pool.release(job)
            self._waiters.pop(plan_id, None)
        else:
            self.pool.submit_reserved(job, self._solve_ahead, plan_id, context, arrival, loop)
        return record, cached

    async def get(self, plan_id: str, wait_ms: int = 0) -> PlanRecord | None:
        """The stored record; with ``wait_ms`` a pending plan is waited for up to that long."""
        deadline = time.monotonic() + wait_ms / 1000.0
        while True:
            record = await asyncio.to_thread(self.store.get, plan_id)
            if record is not None and record.status == "pending" and plan_id not in self._waiters:
                age = (utcnow() - (record.claimed_at or record.created_at)).total_seconds()
                if age > self.settings.stale_after_s:
                    await asyncio.to_thread(self.store.fail, plan_id, LOST)
                    record = await asyncio.to_thread(self.store.get, plan_id)
            left = deadline - time.monotonic()
            if record is None or record.status != "pending" or left <= 0:
                return record
            event = self._waiters.get(plan_id)
            try:
                # Solved in this process: woken at once. Elsewhere (another worker): poll the store.
                await asyncio.wait_for(event.wait() if event else asyncio.sleep(left), timeout=min(left, 5.0 if event else 0.05))
            except TimeoutError:
                pass
