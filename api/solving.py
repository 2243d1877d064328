"""Solving off the event loop: a bounded pool of solve threads and the planning service on top.

Admission control: at most ``solve_workers`` solves run and ``queue_limit`` wait in one process;
a request beyond that is refused at once with 503 and Retry-After instead of piling up. The time
budget of a request counts from its arrival (the queueing and validation time is taken off), and
exact solvers get at most ``solver_threads`` threads each.

Plan-ahead: the request is validated and stored as ``pending`` before the answer (202) is sent,
then solved in the background; the result replaces the pending record, and long-polls waiting on
it in this process are woken.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from api import translate
from api.errors import Overloaded, planner_error_document
from api.metrics import Metrics
from api.settings import Settings
from api.store.repository import PlanRecord, Store, solved_columns, utcnow
from optimizer.errors import PlannerError
from planning.deadline import Deadline
from planning.planner import plan as run_planner

T = TypeVar("T")
log = logging.getLogger("api.solving")


class SolvePool:
    """A fixed set of solve threads with a bounded waiting line."""

    def __init__(self, workers: int, queue_limit: int, retry_after_s: int, metrics: Metrics) -> None:
        self.workers = workers
        self.capacity = workers + queue_limit
        self.retry_after_s = retry_after_s
        self._metrics = metrics
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._admitted = 0
        self._running = 0

    @property
    def in_flight(self) -> int:
        return self._running

    @property
    def queue_depth(self) -> int:
        return self._admitted - self._running

    def _admit(self) -> None:
        with self._lock:
            if self._admitted >= self.capacity:
                self._metrics.rejected.inc()
                raise Overloaded(self.retry_after_s)
            self._admitted += 1
            self._metrics.queue_depth.inc()

    def _wrap(self, fn: Callable[..., T], *args: Any) -> Callable[[], T]:
        def job() -> T:
            with self._lock:
                self._running += 1
            self._metrics.queue_depth.dec()
            self._metrics.in_flight.inc()
            try:
                return fn(*args)
            finally:
                with self._lock:
                    self._running -= 1
                    self._admitted -= 1
                self._metrics.in_flight.dec()
        return job

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="dhp-solve")
            return self._executor

    def _release_admission(self) -> None:
        with self._lock:
            self._admitted -= 1
        self._metrics.queue_depth.dec()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on a solve thread and wait for it; raises Overloaded when full."""
        self._admit()
        try:
            future = asyncio.get_running_loop().run_in_executor(self._pool(), self._wrap(fn, *args))
        except BaseException:
            self._release_admission()
            raise
        return await future

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Start ``fn(*args)`` on a solve thread without waiting; raises Overloaded when full."""
        self._admit()
        try:
            self._pool().submit(self._wrap(fn, *args))
        except BaseException:
            self._release_admission()
            raise

    def shutdown(self) -> None:
        """Wait for the running and waiting solves; a later request starts a fresh pool."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=False)


class PlanCache:
    """Recently returned plans by request hash, in memory (the store is the lasting cache); also by
    the hash of the request exactly as sent, so that a repeated request needs no validation."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, PlanRecord] = OrderedDict()
        self._raw: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get_raw(self, raw: str) -> PlanRecord | None:
        with self._lock:
            key = self._raw.get(raw)
        return self.get(key) if key is not None else None

    def get(self, key: str) -> PlanRecord | None:
        with self._lock:
            rec = self._items.get(key)
            if rec is not None:
                self._items.move_to_end(key)
            return rec

    def put(self, key: str, record: PlanRecord, raw: str | None = None) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._items[key] = record
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
            if raw is not None:
                self._raw[raw] = key
                self._raw.move_to_end(raw)
                while len(self._raw) > self.size:
                    self._raw.popitem(last=False)


LOST = {"type": "https://dhp-planner.dev/problems/lost", "title": "Plan lost", "status": 503,
        "detail": "the server that accepted this plan-ahead request stopped before solving it", "hint": "submit the request again."}


SOLVER_MODULES = ("ortools.sat.python.cp_model", "highspy", "pulp")
"""Loaded once at start-up: a long-running service should not make its first requests pay the
solver libraries' import time (the planner's ``auto`` avoids CP-SAT while OR-Tools is not loaded)."""


def warm_up() -> list[str]:
    """Load the planner's compiled kernels and import the installed solver libraries and backends;
    returns the solver modules now loaded."""
    import importlib

    from planning.planner import warm_up as load_kernels

    load_kernels()
    loaded = []
    for name in SOLVER_MODULES:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except ImportError:
            pass
    from solver_models import available_backends

    available_backends()
    return loaded


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
        self.pool = SolvePool(settings.solve_workers, settings.queue_limit, settings.retry_after_s, metrics)
        self.cache = PlanCache(settings.plan_cache_size)
        self._waiters: dict[str, asyncio.Event] = {}

    # -- in a solve thread ------------------------------------------------------------------

    def _prepare(self, doc: dict[str, Any], use_cache: bool) -> tuple[Any, str, PlanRecord | None, str | None]:
        """Validate and look up the plan cache. A request seen before in exactly the same form
        (same documents, key order aside) skips validation: it passed before under the same settings."""
        caching = use_cache and self.settings.plan_cache_size > 0
        raw = translate.raw_hash(doc) if caching else None
        if raw is not None:
            hit = self.cache.get_raw(raw)
            if hit is not None:
                self.metrics.cache_hits.inc()
                return None, hit.request_hash, hit, raw
        try:
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
                self.cache.put(key, hit, raw)
        return problem, key, hit, raw

    def _solve(self, problem: Any, arrival: float) -> tuple[Any, str]:
        # The budget counts from the request's arrival: queueing and validation are part of it.
        deadline = Deadline.after_ms(problem.options.time_budget_ms, start=arrival)
        try:
            result = run_planner(problem, deadline=deadline)
        except PlannerError as exc:
            self.metrics.failures.labels(kind=type(exc).__name__).inc()
            raise
        stats = result.solver
        self.metrics.solve_latency.labels(backend=stats.backend).observe(stats.wall_ms / 1000.0)
        self.metrics.gap.labels(backend=stats.backend).observe(result.gap)
        if stats.fallback_reason:
            self.metrics.fallbacks.labels(backend=stats.backend).inc()
        return result, translate.plan_text(result)

    def _record(self, plan_id: str, doc: dict[str, Any], problem: Any, key: str, status: str, result: Any = None, text: str | None = None) -> PlanRecord:
        cluster, model = translate.names(doc, problem)
        base = dict(id=plan_id, created_at=utcnow(), status=status, request_hash=key, n_samples=len(problem.batch), n_ranks=problem.cluster.total_gpus,
                    cluster=cluster, model=model, request_json=translate.request_text(doc))
        if result is not None:
            base.update(finished_at=base["created_at"], plan_json=text, **solved_columns(result))
        return PlanRecord(**base)

    def plan_now(self, doc: dict[str, Any], arrival: float, use_cache: bool) -> tuple[PlanRecord, bool, dict[str, float]]:
        """Solve in this thread; also returns where the time went (ms), for the Server-Timing header."""
        t0 = time.perf_counter()
        timings = {"queue": (t0 - arrival) * 1000.0}
        problem, key, hit, raw = self._prepare(doc, use_cache)
        t1 = time.perf_counter()
        timings["translate"] = (t1 - t0) * 1000.0
        if hit is not None:
            timings["done_at"] = time.perf_counter()
            return hit, True, timings
        result, text = self._solve(problem, arrival)
        t2 = time.perf_counter()
        timings["solve"] = result.solver.wall_ms
        timings["encode"] = (t2 - t1) * 1000.0 - result.solver.wall_ms
        record = self._record(uuid.uuid4().hex, doc, problem, key, "done", result, text)
        self.store.add(record)
        self.cache.put(key, record, raw)
        timings["store"] = (time.perf_counter() - t2) * 1000.0
        timings["done_at"] = time.perf_counter()
        return record, False, timings

    def _plan_ahead_job(self, plan_id: str, doc: dict[str, Any], arrival: float, use_cache: bool, loop: asyncio.AbstractEventLoop,
                        accepted: asyncio.Future[tuple[PlanRecord, bool]]) -> None:
        def resolve(result: tuple[PlanRecord, bool] | None = None, exc: BaseException | None = None) -> None:
            def settle() -> None:
                if accepted.done():  # the caller went away
                    return
                if exc is not None:
                    accepted.set_exception(exc)
                else:
                    accepted.set_result(result)  # type: ignore[arg-type]
            _call_soon(loop, settle)

        try:
            problem, key, hit, raw = self._prepare(doc, use_cache)
            if hit is not None:
                resolve((hit, True))
                return
            pending = self._record(plan_id, doc, problem, key, "pending")
            self.store.add(pending)
        except BaseException as exc:  # the request is refused; the waiting handler turns this into the answer
            resolve(exc=exc)
            return
        resolve((pending, False))
        try:
            result, text = self._solve(problem, arrival)
            self.store.finish(plan_id, text, result)
            self.cache.put(key, self.store.get(plan_id) or pending, raw)
        except PlannerError as exc:
            self.store.fail(plan_id, planner_error_document(exc))
        except Exception as exc:
            log.exception("plan-ahead solve %s failed", plan_id)
            self.store.fail(plan_id, {"type": "https://dhp-planner.dev/problems/internal", "title": "Internal error", "status": 500,
                                      "detail": f"{type(exc).__name__} while solving"})
        finally:
            _call_soon(loop, self._wake, plan_id)

    # -- on the event loop ------------------------------------------------------------------

    def _wake(self, plan_id: str) -> None:
        event = self._waiters.pop(plan_id, None)
        if event is not None:
            event.set()

    async def plan(self, doc: dict[str, Any], arrival: float, use_cache: bool = True) -> tuple[PlanRecord, bool, dict[str, float]]:
        """Solve now; returns the stored record, whether it came from the cache, and where the time went
        (``handoff``: from the solve thread's end until this coroutine runs again)."""
        record, cached, timings = await self.pool.run(self.plan_now, doc, arrival, use_cache)
        timings["handoff"] = (time.perf_counter() - timings.pop("done_at")) * 1000.0
        return record, cached, timings

    async def plan_ahead(self, doc: dict[str, Any], arrival: float, use_cache: bool = True) -> tuple[PlanRecord, bool]:
        """Validate and store as pending, answer, and solve in the background."""
        loop = asyncio.get_running_loop()
        plan_id = uuid.uuid4().hex
        accepted: asyncio.Future[tuple[PlanRecord, bool]] = loop.create_future()
        self._waiters[plan_id] = asyncio.Event()
        try:
            self.pool.submit(self._plan_ahead_job, plan_id, doc, arrival, use_cache, loop, accepted)
            record, cached = await accepted
        except BaseException:
            self._waiters.pop(plan_id, None)
            raise
        if cached:
            self._waiters.pop(plan_id, None)
        return record, cached

    async def get(self, plan_id: str, wait_ms: int = 0) -> PlanRecord | None:
        """The stored record; with ``wait_ms`` a pending plan is waited for up to that long."""
        deadline = time.monotonic() + wait_ms / 1000.0
        while True:
            record = await asyncio.to_thread(self.store.get, plan_id)
            if record is not None and record.status == "pending" and plan_id not in self._waiters:
                age = (utcnow() - record.created_at).total_seconds()
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
