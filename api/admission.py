"""Admission control: a fixed set of solve threads with a bounded waiting line, aware of deadlines.

At most ``solve_workers`` solves run and ``queue_limit`` wait in one process; a request beyond that is
refused at once with 503 and Retry-After (:class:`api.errors.Overloaded`) instead of piling up. A
request with a deadline is also refused at once when the waiting line ahead of it, at the recent time
per solve, would leave too little of its budget by the time a worker could take it, and refused when a
worker takes it after waiting that long anyway (a request that found a free worker is always run). Retry-After is computed from the
waiting line: the time the solves admitted now take to drain at the recent time per solve.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from api.errors import Overloaded
from api.metrics import Metrics

T = TypeVar("T")
SMOOTHING = 0.2
"""Weight of the newest solve in the running mean of solve times."""


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
        self._mean_s: float | None = None
        self._starts: dict[int, float] = {}
        """When each running job started, by worker thread."""

    @property
    def in_flight(self) -> int:
        return self._running

    @property
    def queue_depth(self) -> int:
        return self._admitted - self._running

    @property
    def full(self) -> bool:
        return self._admitted >= self.capacity

    @property
    def mean_solve_s(self) -> float | None:
        """Running mean of the time a job holds a worker (None before the first one ends)."""
        return self._mean_s

    def _wait_s(self, now: float) -> float:
        """Expected wait before a worker is free for a job admitted now: the running jobs end at their start plus the
        mean time per solve (or now, when overdue), then the jobs waiting ahead take the workers in turn."""
        if self._mean_s is None or self._admitted < self.workers:
            return 0.0
        free = [max(now, start + self._mean_s) for start in self._starts.values()]
        free += [now] * (self.workers - len(free))
        heapq.heapify(free)
        for _ in range(self._admitted - len(self._starts)):
            heapq.heappush(free, heapq.heappop(free) + self._mean_s)
        return free[0] - now

    def retry_after(self) -> int:
        """Seconds after which the solves admitted now should have drained (the configured value until a solve has been timed)."""
        if self._mean_s is None:
            return self.retry_after_s
        return max(1, min(3600, math.ceil(self._admitted / self.workers * self._mean_s)))

    def refused(self, detail: str | None = None) -> Overloaded:
        """The 503 to answer with (counted)."""
        self._metrics.rejected.inc()
        return Overloaded(self.retry_after(), detail)

    def _admit(self, deadline: float | None = None, min_left_s: float = 0.0) -> bool:
        """Take a place (or raise Overloaded); whether every worker was busy, so that the job waits."""
        with self._lock:
            if self._admitted >= self.capacity:
                raise self.refused()
            if deadline is not None:
                now = time.perf_counter()
                wait = self._wait_s(now)
                if now + wait + min_left_s > deadline:
                    raise self.refused(f"the solves ahead would use up this request's time budget (about {wait * 1000:.0f} ms of waiting)")
            queued = self._admitted >= self.workers
            self._admitted += 1
            self._metrics.queue_depth.inc()
            return queued

    def _wrap(self, fn: Callable[..., T], *args: Any, late_after: float | None = None) -> Callable[[], T]:
        def job() -> T:
            with self._lock:
                self._running += 1
            self._metrics.queue_depth.dec()
            self._metrics.in_flight.inc()
            start = time.perf_counter()
            if late_after is not None and start > late_after:  # it waited for a worker until too little of its budget was left
                with self._lock:
                    self._running -= 1
                    self._admitted -= 1
                self._metrics.in_flight.dec()
                raise self.refused("this request waited past its time budget for a free solve worker")
            me = threading.get_ident()
            with self._lock:
                self._starts[me] = start
            try:
                return fn(*args)
            finally:
                took = time.perf_counter() - start
                with self._lock:
                    self._starts.pop(me, None)
                    self._running -= 1
                    self._admitted -= 1
                    self._mean_s = took if self._mean_s is None else (1 - SMOOTHING) * self._mean_s + SMOOTHING * took
                self._metrics.in_flight.dec()
        return job

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="dhp-solve")
            return self._executor

    def release(self) -> None:
        """Give back a place taken with :meth:`reserve` that will not be used."""
        with self._lock:
            self._admitted -= 1
        self._metrics.queue_depth.dec()

    async def run(self, fn: Callable[..., T], *args: Any, deadline: float | None = None, min_left_s: float = 0.0) -> T:
        """Run ``fn(*args)`` on a solve thread and wait for it; raises Overloaded when full, or when the
        waiting line would leave it less than ``min_left_s`` before ``deadline`` (a ``time.perf_counter`` instant); a job that
        had to wait for a worker and is taken with less than that left is refused then instead of run."""
        queued = self._admit(deadline, min_left_s)
        late_after = deadline - min_left_s if queued and deadline is not None else None
        try:
            future = asyncio.get_running_loop().run_in_executor(self._pool(), self._wrap(fn, *args, late_after=late_after))
        except BaseException:
            self.release()
            raise
        return await future

    def reserve(self) -> None:
        """Take a place in the waiting line now (raises Overloaded when full); :meth:`submit_reserved` uses it, :meth:`release` gives it back."""
        self._admit()

    def submit_reserved(self, fn: Callable[..., Any], *args: Any) -> None:
        """Start ``fn(*args)`` on a solve thread in a place taken with :meth:`reserve`, without waiting."""
        try:
            self._pool().submit(self._wrap(fn, *args))
        except BaseException:
            self.release()
            raise

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Start ``fn(*args)`` on a solve thread without waiting; raises Overloaded when full."""
        self.reserve()
        self.submit_reserved(fn, *args)

    def shutdown(self) -> None:
        """Wait for the running and waiting solves; a later request starts a fresh pool."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=False)
