"""The planning service: validate, look up the cache, solve off the event loop within the budget, store.

Admission (:mod:`api.service.admission`) bounds the solves running and waiting; the plan cache
(:mod:`api.service.plan_cache`) answers repeated requests. The time budget of a request counts from its
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
from datetime import datetime
from typing import Any, TypeVar

from api.service import translate
from api.service.admission import MAX_RESERVE_SHARE, AnswerTail, SolvePool
from api.service.metrics import Metrics
from api.service.plan_cache import Flight, InFlight, PlanCache
from api.service.problem_details import STORE_DOWN, StoreUnavailable, planner_error_document
from api.service.settings import Settings
from api.store.repository import PlanRecord, Store, plan_speedup, request_columns, solved_columns, utcnow
from optimizer.errors import PlannerError, ProblemError
from optimizer.gc_pause import collector_paused
from planning.deadline import Deadline
from planning.fixed_work import problem_budget_ms, problem_estimate_ms, suggested_budget_ms
from planning.planner import plan as run_planner

T = TypeVar("T")
log = logging.getLogger("api.service.planning_service")


LOST = {
    "type": "https://dhp-planner.dev/problems/lost",
    "title": "Plan lost",
    "status": 503,
    "detail": "the server that accepted this plan-ahead request stopped before solving it",
    "hint": "submit the request again.",
}
MIN_BUDGET_SHARE = 0.1
"""A request that the waiting line would leave with less than this share of its time budget is refused (503) rather
than solved in a hurry."""
INTERNAL = {
    "type": "https://dhp-planner.dev/problems/internal",
    "title": "Internal error",
    "status": 500,
    "detail": "the solve failed; the log has why",
}


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
        self.pool = SolvePool(
            settings.solve_workers, settings.queue_limit, settings.retry_after_s, metrics, nice=settings.solve_nice
        )
        self.tail = AnswerTail()
        self.cache = PlanCache(settings.plan_cache_size)
        self.flights = InFlight()
        self.resumed = threading.Event()
        """Set once the plan-ahead requests left pending by an earlier process have been taken up (at start-up)."""
        self._waiters: dict[str, asyncio.Event] = {}
        self._preparing: dict[str, asyncio.Future[Any]] = {}
        """Validations of requests in flight by raw hash: identical requests sent at once are validated once."""
        self._joining: dict[str, asyncio.Future[Any]] = {}
        """Pending records being stored for plan-ahead requests that joined a solve, by plan id."""

    # -- in a solve thread ------------------------------------------------------------------

    def _prepare(
        self, doc: dict[str, Any], use_cache: bool, raw: str | None = None
    ) -> tuple[Any, str, PlanRecord | None, str | None]:
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

    def _solve(self, problem: Any, arrival: float, reserve_s: float = 0.0) -> tuple[Any, str, float]:
        """The plan, its text, and the planner's own time in this call (ms). The planner's deadline is
        ``reserve_s`` before the end of the budget, which counts from the request's arrival (queueing and
        validation are part of it)."""
        budget_s = problem.options.budget_ms / 1000.0
        deadline = Deadline(arrival, arrival + budget_s - reserve_s)
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

    def _record(
        self,
        plan_id: str,
        doc: dict[str, Any],
        problem: Any,
        key: str,
        status: str,
        result: Any = None,
        text: str | None = None,
    ) -> PlanRecord:
        cluster, model = translate.names(doc, problem)
        base = dict(
            id=plan_id,
            created_at=utcnow(),
            status=status,
            request_hash=key,
            n_samples=len(problem.batch),
            n_ranks=problem.cluster.total_gpus,
            cluster=cluster,
            model=model,
            request_json=translate.request_text(doc),
            **{**request_columns(doc), "budget_ms": problem.options.budget_ms},  # what "auto" came to
        )
        if result is not None:
            base.update(
                finished_at=base["created_at"], plan_json=text, speedup=plan_speedup(result), **solved_columns(result)
            )
        else:
            base.update(claimed_at=base["created_at"])
        return PlanRecord(**base)

    def plan_now(
        self,
        problem: Any,
        key: str,
        raw: str | None,
        flight: Flight | None,
        doc: dict[str, Any],
        arrival: float,
        submitted: float,
        reserve_s: float = 0.0,
    ) -> tuple[PlanRecord, dict[str, float]]:
        """Solve and store a request that waits for its plan, in this (solve) thread; the record and where the time
        went (ms; ``queue``: waiting for this thread). The plan takes its flight's id, so that plan-ahead requests
        that joined the solve get this plan."""
        t1 = time.perf_counter()
        timings: dict[str, float] = {"queue": (t1 - submitted) * 1000.0}
        try:
            result, text, solve_ms = self._solve(problem, arrival, reserve_s)
            t2 = time.perf_counter()
            timings["solve"] = solve_ms
            timings["encode"] = (t2 - t1) * 1000.0 - solve_ms
            record = self._record(
                flight.plan_id if flight else uuid.uuid4().hex, doc, problem, key, "done", result, text
            )
            self.store.save_done(record)
        except BaseException as exc:
            if flight is not None:
                self.flights.land(key, flight, error=exc)
                self._fail_joined(flight, exc)
            raise
        self.cache.put(key, record, raw)
        if flight is not None:
            self.flights.land(key, flight, record)
        timings["store"] = (time.perf_counter() - t2) * 1000.0
        timings["done_at"] = time.perf_counter()
        return record, timings

    def _fail_joined(self, flight: Flight, exc: BaseException) -> None:
        """Settle as failed the pending record that plan-ahead requests joined to a solve that
        failed (none: nothing)."""
        if flight.pending is not None:
            self._write(
                self.store.fail,
                flight.plan_id,
                planner_error_document(exc) if isinstance(exc, PlannerError) else INTERNAL,
            )

    def _solve_ahead(
        self,
        plan_id: str,
        problem: Any,
        key: str,
        raw: str | None,
        flight: Flight | None,
        arrival: float,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """Solve an accepted plan-ahead request on a solve worker and store the answer; long-polls in
        this process are woken."""
        record: PlanRecord | None = None
        error: BaseException | None = None
        try:
            record, error = self._solve_pending(plan_id, problem, arrival)
            if record is not None:
                self.cache.put(key, record, raw)
        finally:
            if flight is not None:
                self.flights.land(
                    key,
                    flight,
                    record,
                    None if record is not None else error or StoreUnavailable("the solve ended without a plan"),
                )
            _call_soon(loop, self._wake, plan_id)

    def _solve_pending(
        self, plan_id: str, problem: Any, arrival: float
    ) -> tuple[PlanRecord | None, BaseException | None]:
        """Solve a pending plan and store the answer (retried while the store is down); the
        stored record or the error."""
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
        stored = self._write(self.store.get, plan_id)
        return (stored, None) if stored is not None else (None, StoreUnavailable("the plan store did not answer"))

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
                    log.error(
                        "the plan store did not answer for %.0f s (%s); left pending for a later start to resume",
                        self.settings.store_retry_s,
                        exc,
                    )
                    return None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

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
            record, _ = self._solve_pending(pending.id, problem, time.perf_counter())
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

    def _shared(
        self, table: dict[str, asyncio.Future[Any]], raw: str | None, start: Callable[[], Any]
    ) -> tuple[asyncio.Future[Any], bool]:
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

    async def _prepared(
        self, doc: dict[str, Any], use_cache: bool, raw: str | None
    ) -> tuple[Any, str, PlanRecord | None, str | None, float]:
        """:meth:`_prepare` off the event loop, and its time (ms); identical requests (same raw hash)
        asked at once share it."""

        def prepare() -> tuple[Any, str, PlanRecord | None, str | None, float]:
            began = time.perf_counter()
            problem, key, hit, kept = self._prepare(doc, use_cache, raw)
            return problem, key, hit, kept, (time.perf_counter() - began) * 1000.0

        task, _ = self._shared(self._preparing, raw, lambda: asyncio.to_thread(prepare))
        return await asyncio.shield(task)

    async def plan(
        self, doc: dict[str, Any], arrival: float, use_cache: bool = True, raw: str | None = None
    ) -> tuple[PlanRecord, bool, dict[str, float]]:
        """Solve now; returns the stored record, whether it came from the cache (or an identical request
        in flight), and where the time went (``handoff``: from the solve thread's end until this coroutine runs again).
        ``raw`` identifies the request as sent (the body's hash); computed from ``doc`` when not given."""
        raw = (raw or translate.raw_hash(doc)) if use_cache else None
        if raw is None or (
            raw not in self._preparing and self.cache.get_raw(raw) is None
        ):  # nothing to share: refused before validation
            asked_s = translate.budget_ms(doc) / 1000.0
            refusal = self.pool.refusal(arrival + asked_s, MIN_BUDGET_SHARE * asked_s)
            if refusal is not None:
                raise refusal
        problem, key, hit, raw, translate_ms = await self._prepared(doc, use_cache, raw)
        if hit is not None:
            return hit, True, {"translate": translate_ms}
        flight = self.flights.get(key) if use_cache else None
        if flight is not None:  # an identical request, in either wait mode, is being solved: its plan
            record = await asyncio.shield(asyncio.wrap_future(flight.done))
            return record, True, {"translate": translate_ms, "shared": (time.perf_counter() - arrival) * 1000.0}
        budget_s = problem.options.budget_ms / 1000.0
        n = len(problem.batch)
        self._refuse_short_budget(problem, (time.perf_counter() - arrival) * 1000.0, self.tail.after_s(n) * 1000.0)
        reserve_s = self.tail.reserve_s(budget_s, n)
        job = self.pool.admit(arrival + budget_s, MIN_BUDGET_SHARE * budget_s)
        flight = self.flights.claim(key, uuid.uuid4().hex)[0] if use_cache else None
        submitted = time.perf_counter()
        try:
            record, timings = await asyncio.shield(
                self.pool.start(job, self.plan_now, problem, key, raw, flight, doc, arrival, submitted, reserve_s)
            )
        except BaseException as exc:
            if flight is not None:  # refused or failed before its solve could land it
                self.flights.land(key, flight, error=exc)
            raise
        now = time.perf_counter()
        after_ms = timings["encode"] + timings["store"] + (now - timings["done_at"]) * 1000.0
        self.tail.observe(now - (arrival + budget_s - reserve_s), n, after_ms / 1000.0)
        # Answers late although the planner is kept back all it may be:
        # admit no request to wait until they keep time again.
        self.pool.queue_open = self.tail.reserve_s(budget_s, n) < MAX_RESERVE_SHARE * budget_s
        timings = {"translate": translate_ms, **timings, "reserve": reserve_s * 1000.0}
        timings["handoff"] = (now - timings.pop("done_at")) * 1000.0
        return record, False, timings

    async def plan_ahead(
        self, doc: dict[str, Any], arrival: float, use_cache: bool = True, raw: str | None = None
    ) -> tuple[PlanRecord, bool]:
        """Validate and store as pending, answer, and solve in the background. A request identical to one being
        solved, in either wait mode, gets that solve's id and plan."""
        raw = (raw or translate.raw_hash(doc)) if use_cache else None
        problem, key, hit, raw, _ = await self._prepared(doc, use_cache, raw)
        if hit is not None:
            return hit, True
        flight = self.flights.get(key) if use_cache else None
        if flight is not None:
            return await self._join_ahead(doc, problem, key, flight)
        self._refuse_short_budget(problem)
        # A place in the solve queue is taken first (503 at once when full); the answer does not wait for a free worker.
        job = self.pool.reserve(arrival + problem.options.budget_ms / 1000.0)
        plan_id = uuid.uuid4().hex
        flight = self.flights.claim(key, plan_id)[0] if use_cache else None
        pending = self._record(plan_id, doc, problem, key, "pending")
        self._waiters[plan_id] = asyncio.Event()
        try:
            await asyncio.to_thread(self.store.add_if_absent, pending)  # False: a joined request stored this id first
        except BaseException as exc:
            self.pool.release(job)
            self._waiters.pop(plan_id, None)
            if flight is not None:
                self.flights.land(key, flight, error=exc)
            raise
        if flight is not None:
            flight.pending = pending
        self.pool.submit_reserved(
            job, self._solve_ahead, plan_id, problem, key, raw, flight, arrival, asyncio.get_running_loop()
        )
        return pending, False

    @staticmethod
    def _refuse_short_budget(problem: Any, spent_ms: float = 0.0, after_ms: float = 0.0) -> None:
        """Refuse at once (422 on ``options.time_budget_ms``) a budget that cannot hold the batch's fixed work here:
        the planner's (:func:`planning.fixed_work.problem_budget_ms`) plus, for an answer that waits, what this
        request already spent (reading and validating it) and the service's median work after the planner on
        answers of this size. Deterministic plans are never refused."""
        if problem.options.deterministic:
            return
        planner_ms = problem_budget_ms(problem)
        asked_ms = problem.options.budget_ms
        if asked_ms >= spent_ms + planner_ms + after_ms:
            return
        expected_ms = problem_estimate_ms(problem)
        needed_ms = spent_ms + expected_ms + after_ms
        raise ProblemError(
            f"is {asked_ms:g} ms, but a batch of {len(problem.batch)} samples on {problem.cluster.domain_size} ranks "
            f"needs about {needed_ms:.0f} ms here: {spent_ms:.0f} ms reading and validating it, "
            f"{expected_ms:.0f} ms of planning that every answer pays, {after_ms:.0f} ms encoding and storing the "
            "plan",
            field="options.time_budget_ms",
            hint=(
                f"ask for options.time_budget_ms of at least {suggested_budget_ms(needed_ms)}, or send a smaller batch."
            ),
        )

    async def _join_ahead(self, doc: dict[str, Any], problem: Any, key: str, flight: Flight) -> tuple[PlanRecord, bool]:
        """A plan-ahead request identical to one being solved: answered with that solve's id, under which
        a pending record is stored first (once), so that an acknowledged id is never lost; when the solve
        has ended, its record."""
        if flight.done.done():
            return flight.done.result(), True  # its error, if it failed
        if flight.pending is not None:
            return flight.pending, False
        task = self._joining.get(flight.plan_id)
        if task is None:
            task = self._joining[flight.plan_id] = asyncio.ensure_future(self._store_joined(doc, problem, key, flight))
            task.add_done_callback(lambda _: self._joining.pop(flight.plan_id, None))
        record = await asyncio.shield(task)
        return record, record.status == "done"

    async def _store_joined(self, doc: dict[str, Any], problem: Any, key: str, flight: Flight) -> PlanRecord:
        """Store the pending record of a solve that plan-ahead requests joined; the record stored under its id."""
        loop = asyncio.get_running_loop()
        if flight.plan_id not in self._waiters:
            self._waiters[flight.plan_id] = asyncio.Event()
            flight.done.add_done_callback(lambda _: _call_soon(loop, self._wake, flight.plan_id))
        pending = self._record(flight.plan_id, doc, problem, key, "pending")
        inserted = await asyncio.to_thread(self.store.add_if_absent, pending)
        flight.pending = pending
        if flight.done.done() and flight.done.exception() is not None:  # the solve failed before this record was stored
            await asyncio.to_thread(self._fail_joined, flight, flight.done.exception())  # type: ignore[arg-type]
        if inserted:
            return pending
        return await asyncio.to_thread(self.store.get, flight.plan_id) or pending

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
                await asyncio.wait_for(
                    event.wait() if event else asyncio.sleep(left), timeout=min(left, 5.0 if event else 0.05)
                )
            except TimeoutError:
                pass
