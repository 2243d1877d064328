"""Admission control: a fixed set of solve threads with a bounded waiting line.

At most ``solve_workers`` solves run and ``queue_limit`` wait in one process; a request beyond that is
refused at once with 503 and Retry-After (:class:`api.errors.Overloaded`) instead of piling up.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from api.errors import Overloaded
from api.metrics import Metrics

T = TypeVar("T")


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
