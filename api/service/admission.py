"""Admission control: a fixed set of solve threads with a bounded waiting line, aware of deadlines.

At most ``solve_workers`` solves run and ``queue_limit`` wait in one process; a request beyond that is refused at once
with 503 and Retry-After (:class:`api.service.problem_details.Overloaded`) instead of piling up. A request with a
deadline that has to wait for a worker is also refused at once when the solves ahead of it would leave it less than its
share of the budget (one that finds a free worker is always run). Each solve ahead is expected to hold its worker until
the earlier of its own deadline (plus the recent overrun past deadlines) and its start plus a high estimate of a solve's
time (the 90th percentile of the latest 64; before the first solve of the process ends, none is expected to wait), so
the estimate errs on the long side: a request admitted is not refused later; one a worker takes late (a solve overran
every estimate) is solved with what is left of its budget, and counted (``dhp_late_starts_total``). Retry-After is the
time the solves admitted now are expected to take to drain.

Solve threads run at a lower CPU priority (``nice``, Linux) than the event loop, so that on a machine
whose cores the solves fill, answers (refusals included) are not kept waiting for a core.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from api.service.metrics import Metrics
from api.service.problem_details import Overloaded

T = TypeVar("T")
SMOOTHING = 0.2
"""Weight of the newest solve in the running mean of solve times (and of overruns past deadlines)."""
RECENT = 64
LONG_QUANTILE = 0.9
"""A solve is expected to end within this quantile of the latest RECENT solve times (when its deadline is later)."""
log = logging.getLogger("api.service.admission")


@dataclass
class _Job:
    deadline: float | None
    """``time.perf_counter()`` instant by which the solve should end (None: no budget, e.g. a replan)."""
    start: float | None = None
    """When a worker took it (None while it waits)."""


TAIL_QUANTILE = 0.9
MAX_RESERVE_SHARE = 0.5
"""The planner always keeps at least this share of a request's budget for its search, however slow answers were."""


def nearest_rank(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted, non-empty ``ordered`` by nearest rank (a value that occurred)."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def size_class(n_samples: int) -> int:
    """Batches of about the same size share a class: under 1,024 samples, then each factor of four."""
    return 0 if n_samples < 1024 else (n_samples.bit_length() - 11) // 2 + 1


class AnswerTail:
    """How long answers go out after the deadline their planner was given (the planner's overrun, encoding,
    storing, the hand back to the event loop) and how long the service's own work after the planner took, over
    the latest :data:`RECENT` answers of each batch size class (:func:`size_class`: encoding and storing grow with
    the batch). On a machine whose CPU is shared (other processes, many clients) the tail grows, so the planner is
    given the budget less a high quantile of it (:meth:`reserve_s`): the service reserves for the CPU it actually
    gets rather than for an idle machine's. A size class not timed yet borrows the per-sample rate of the nearest
    class of at least 1,024 samples that was (below that, a constant cost dominates and would not scale)."""

    def __init__(self) -> None:
        self._tails: dict[int, deque[float]] = {}
        self._after: dict[int, deque[tuple[float, int]]] = {}
        self._lock = threading.Lock()

    def observe(self, tail_s: float, n_samples: int = 0, after_s: float = 0.0) -> None:
        """One answer: how late it went out after its planner's deadline, and the service's work after the planner."""
        size = size_class(n_samples)
        with self._lock:
            self._tails.setdefault(size, deque(maxlen=RECENT)).append(max(0.0, tail_s))
            self._after.setdefault(size, deque(maxlen=RECENT)).append((max(0.0, after_s), max(1, n_samples)))

    def reserve_s(self, budget_s: float, n_samples: int = 0) -> float:
        """Seconds of ``budget_s`` to keep back from the planner: the tail's high quantile at this size, and at least
        the service's work after the planner (answers that came early, their planner done before its deadline, say
        nothing of a planner that runs to it); 0 when nothing is timed."""
        with self._lock:
            tails = sorted(self._tails.get(size_class(n_samples), ()))
        tail = nearest_rank(tails, TAIL_QUANTILE) if tails else 0.0
        return min(MAX_RESERVE_SHARE * budget_s, max(tail, self.after_s(n_samples)))

    def after_s(self, n_samples: int) -> float:
        """The service's work after the planner on a batch of ``n_samples``: the median at its size, else the median
        per-sample rate of the nearest timed class of at least 1,024 samples times ``n_samples`` (0: none timed, or a
        batch of fewer than 1,024 samples, whose cost does not scale with it)."""
        size = size_class(n_samples)
        with self._lock:
            own = sorted(a for a, _ in self._after.get(size, ()))
            if own:
                return nearest_rank(own, 0.5)
            timed = sorted((abs(c - size), c) for c, seen in self._after.items() if c >= 1 and seen)
            if size < 1 or not timed:
                return 0.0
            rates = sorted(a / n for a, n in self._after[timed[0][1]])
        return nearest_rank(rates, 0.5) * n_samples


def lower_priority(nice: int) -> None:
    """Lower the CPU priority of the calling thread (Linux threads have their own nice value); nothing elsewhere."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except OSError as exc:  # not allowed here: run at the process's priority
        log.warning("could not lower the solve threads' priority: %s", exc)


class SolvePool:
    """A fixed set of solve threads with a bounded waiting line."""

    def __init__(self, workers: int, queue_limit: int, retry_after_s: int, metrics: Metrics, nice: int = 0) -> None:
        self.workers = workers
        self.capacity = workers + queue_limit
        self.queue_open = True
        """False while answers run late even with the most the planner may be kept back (:class:`AnswerTail` at its
        cap): the machine gives the solves less CPU than they need, so no request is admitted to wait, and those
        beyond the running solves are refused before their body is read."""
        self.retry_after_s = retry_after_s
        self.nice = nice
        self._metrics = metrics
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.RLock()
        self._jobs: dict[int, _Job] = {}
        """Admitted jobs in admission order: running (``start`` set) and waiting."""
        self._ids = itertools.count()
        self._mean_s: float | None = None
        self._recent: deque[float] = deque(maxlen=RECENT)
        """The times of the latest solves."""
        self._overrun_s = 0.0

    @property
    def in_flight(self) -> int:
        with self._lock:
            return sum(1 for job in self._jobs.values() if job.start is not None)

    @property
    def queue_depth(self) -> int:
        with self._lock:
            return len(self._jobs) - self.in_flight

    @property
    def full(self) -> bool:
        return len(self._jobs) >= (self.capacity if self.queue_open else self.workers)

    @property
    def mean_solve_s(self) -> float | None:
        """Running mean of the time a job holds a worker (None before the first one ends)."""
        return self._mean_s

    def _end(self, start: float, deadline: float | None) -> float:
        """When a job that starts at ``start`` is expected to give its worker back (an estimate on the long side)."""
        if (
            not self._recent
        ):  # nothing timed yet in this process: no wait is assumed (the first solves give the estimate)
            return start
        long_s = nearest_rank(sorted(self._recent), LONG_QUANTILE)
        if deadline is None:
            return start + long_s
        return max(start, min(deadline + self._overrun_s, start + long_s))

    def _free_times(self, now: float) -> list[float]:
        """When each worker is expected to be free for a job admitted now (a heap), after the
        jobs admitted before it."""
        free = [max(now, self._end(job.start, job.deadline)) for job in self._jobs.values() if job.start is not None]
        free += [now] * max(0, self.workers - len(free))
        heapq.heapify(free)
        for job in self._jobs.values():
            if job.start is None:
                heapq.heappush(free, self._end(heapq.heappop(free), job.deadline))
        return free

    def wait_s(self, now: float | None = None) -> float:
        """Expected wait before a worker takes a job admitted now."""
        now = time.perf_counter() if now is None else now
        with self._lock:
            return self._free_times(now)[0] - now

    def retry_after(self) -> int:
        """Seconds after which the solves admitted now should have drained (the configured value until a
        solve has been timed)."""
        if self._mean_s is None:
            return self.retry_after_s
        now = time.perf_counter()
        with self._lock:
            drained = max(self._free_times(now)) - now
        return max(1, min(3600, math.ceil(drained)))

    def refused(self, detail: str | None = None) -> Overloaded:
        """The 503 to answer with (counted)."""
        self._metrics.rejected.inc()
        return Overloaded(self.retry_after(), detail)

    def refusal(
        self, deadline: float | None = None, min_left_s: float = 0.0, refuse_late: bool = True
    ) -> Overloaded | None:
        """The 503 a job would get now (None: it would be admitted). Asked before a request is validated, it spares
        an overloaded service the validation of requests it would refuse anyway."""
        with self._lock:
            if self.full:
                return self.refused()
            if (
                deadline is not None and refuse_late and len(self._jobs) >= self.workers
            ):  # one that finds a free worker is always run
                now = time.perf_counter()
                wait = self._free_times(now)[0] - now
                if now + wait + min_left_s > deadline:
                    return self.refused(
                        f"the solves ahead would use up this request's time budget (about {wait * 1000:.0f} ms "
                        "of waiting)"
                    )
        return None

    def _admit(self, deadline: float | None = None, min_left_s: float = 0.0, refuse_late: bool = True) -> int:
        """Take a place (or raise Overloaded); the job's id. With ``refuse_late``, a job the solves ahead would start
        with less than ``min_left_s`` before its ``deadline`` is refused."""
        with self._lock:
            refusal = self.refusal(deadline, min_left_s, refuse_late)
            if refusal is not None:
                raise refusal
            job_id = next(self._ids)
            self._jobs[job_id] = _Job(deadline)
        self._metrics.queue_depth.inc()
        return job_id

    def _wrap(self, job_id: int, fn: Callable[..., T], *args: Any) -> Callable[[], T]:
        def job() -> T:
            start = time.perf_counter()
            with self._lock:
                entry = self._jobs[job_id]
                entry.start = start
            self._metrics.queue_depth.dec()
            self._metrics.in_flight.inc()
            if entry.deadline is not None and start > entry.deadline:
                self._metrics.late_starts.inc()
            try:
                return fn(*args)
            finally:
                end = time.perf_counter()
                took = end - start
                with self._lock:
                    del self._jobs[job_id]
                    self._mean_s = took if self._mean_s is None else (1 - SMOOTHING) * self._mean_s + SMOOTHING * took
                    self._recent.append(took)
                    if entry.deadline is not None and end > entry.deadline:
                        self._overrun_s = (1 - SMOOTHING) * self._overrun_s + SMOOTHING * (end - entry.deadline)
                self._metrics.in_flight.dec()

        return job

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=self.workers,
                    thread_name_prefix="dhp-solve",
                    initializer=lower_priority,
                    initargs=(self.nice,),
                )
            return self._executor

    def release(self, job_id: int) -> None:
        """Give back a place taken with :meth:`reserve` that will not be used."""
        with self._lock:
            self._jobs.pop(job_id, None)
        self._metrics.queue_depth.dec()

    def admit(self, deadline: float | None = None, min_left_s: float = 0.0) -> int:
        """Take a place for a solve now; raises Overloaded when full, or when the solves ahead would leave it less
        than ``min_left_s`` before ``deadline`` (a ``time.perf_counter`` instant). :meth:`start` runs it."""
        return self._admit(deadline, min_left_s)

    def start(self, job_id: int, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run ``fn(*args)`` on a solve thread in a place taken with :meth:`admit`; its future (on the running loop)."""
        try:
            return asyncio.get_running_loop().run_in_executor(self._pool(), self._wrap(job_id, fn, *args))
        except BaseException:
            self.release(job_id)
            raise

    async def run(self, fn: Callable[..., T], *args: Any, deadline: float | None = None, min_left_s: float = 0.0) -> T:
        """Run ``fn(*args)`` on a solve thread and wait for it (:meth:`admit`, then :meth:`start`)."""
        return await self.start(self.admit(deadline, min_left_s), fn, *args)

    def reserve(self, deadline: float | None = None) -> int:
        """Take a place in the waiting line now (raises Overloaded when full) for a job to end by ``deadline``;
        :meth:`submit_reserved` uses it, :meth:`release` gives it back."""
        return self._admit(deadline, refuse_late=False)

    def submit_reserved(self, job_id: int, fn: Callable[..., Any], *args: Any) -> None:
        """Start ``fn(*args)`` on a solve thread in a place taken with :meth:`reserve`, without waiting."""
        try:
            self._pool().submit(self._wrap(job_id, fn, *args))
        except BaseException:
            self.release(job_id)
            raise

    def submit(self, fn: Callable[..., Any], *args: Any, deadline: float | None = None) -> None:
        """Start ``fn(*args)`` on a solve thread without waiting; raises Overloaded when full."""
        self.submit_reserved(self.reserve(deadline), fn, *args)

    def shutdown(self) -> None:
        """Wait for the running and waiting solves; a later request starts a fresh pool."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=False)
