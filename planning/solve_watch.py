"""Exact backends run so that the plan never waits for them past its deadline.

:func:`solve_watched` runs a backend's ``solve`` in a thread of its own and waits for the answer
until its hard stop (:mod:`planning.budget_policy`: the solver's deadline plus a grace). An answer in
time is used. A backend that has not answered by then is *stopped*: the planner stops waiting and goes
on with the plan it has (the heuristic's, the best so far), and the solve's
:class:`solver_models.stop.StopSignal` is set, so that a built-in backend ends its work (CP-SAT stops
its search, HiGHS cancels its run, CBC's process is killed, the neighbourhood search starts no further
round). A backend that does not look at the signal, or is stuck, runs on in its thread; while MAX_LATE
such solves of one backend run, that backend is not started again in this process (:func:`busy`): a
stuck backend costs a thread or two, not one per plan.

While the solver runs, the cyclic garbage collector stays paused as for the rest of the plan, and
the waiting thread collects the youngest generation itself (every POLL_S, when it has grown past
the collector's own threshold): solver libraries build objects with reference cycles that must not
pile up for the whole budget, while a full collection (60 to 75 ms on the heap of a process that has
loaded OR-Tools, HiGHS and PuLP, measured on the 2-core development machine) would hold every thread,
the waiting one included, past the deadline.

With ``options.deterministic`` the plan must not depend on the clock: the hard stop is then only a
safety net, budgets after the deadline.
"""

from __future__ import annotations

import atexit
import functools
import gc
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from optimizer.costs.tables import CostTables
from optimizer.plan.records import Assignment
from solver_models.base import Backend, ImprovementCallback, SolveResult
from solver_models.stop import StopSignal, stopping

POLL_S = 0.01
"""How often the waiting thread wakes to collect young garbage while the solver runs (chosen by hand)."""
MIDDLE_EARLY = 3
"""The middle generation is collected while this many young collections are still short of its threshold
(the young collections of the last YOUNG_MARGIN_S, skipped, cannot then reach it)."""
YOUNG_MARGIN_S = 0.025
"""No young collection closer than this to the end of the wait: one can take 10 ms when the heuristic
left many objects behind (measured on the 2-core development machine), and the plan's last steps
must not wait for it."""
EXIT_WAIT_S = 5.0
"""How long the process waits at exit for solves that were stopped but still run (see :func:`_settle_at_exit`;
chosen by hand)."""

MAX_LATE = 2
"""Solves of one backend that may run on after their stop before the backend is no longer started."""

_lock = threading.Lock()
_running_late: dict[str, int] = {}
"""Backend name -> solves stopped at their deadline whose thread has not ended yet."""


@dataclass
class Watched:
    """A backend's answer (``result``), the exception it raised (``error``), or neither when it was
    ``stopped`` at the deadline, still running."""

    result: SolveResult | None = None
    error: BaseException | None = None
    stopped: bool = False
    waited_ms: float = 0.0


def still_running(name: str) -> int:
    """Solves of backend ``name`` stopped at an earlier deadline whose thread is still running."""
    with _lock:
        return _running_late.get(name, 0)


def busy(name: str) -> bool:
    """Whether backend ``name`` has MAX_LATE stopped solves still running (then it is not started)."""
    return still_running(name) >= MAX_LATE


def settle(timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for every stopped solve's thread to end; True when none is left."""
    end = time.perf_counter() + timeout_s
    while True:
        with _lock:
            if not any(_running_late.values()):
                return True
        if time.perf_counter() >= end:
            return False
        time.sleep(0.005)


@functools.cache
def _settle_at_exit() -> None:
    """Before the interpreter exits, give stopped solves up to EXIT_WAIT_S to end: a solver library
    still running in a thread while the process tears down its native state can abort the process
    (HiGHS does: "terminate called without an active exception") after the plan was written."""
    atexit.register(settle, EXIT_WAIT_S)


def _collect_young() -> None:
    """Collect the youngest generation when it has grown past the collector's threshold (the cycles a
    solver builds die young; survivors wait, as during the rest of the plan, for the collector to resume).

    Each such collection counts towards the middle generation's threshold; once that is near, the
    middle generation is collected here too. Otherwise the collector, resumed at the end of the plan,
    would start with it: a pass over every object the solve promoted (11 ms over a stopped HiGHS
    model's 27,000 objects, measured on the 2-core development machine) after the plan's last step."""
    count, threshold = gc.get_count(), gc.get_threshold()
    if count[1] >= threshold[1] - MIDDLE_EARLY:
        gc.collect(1)
    elif count[0] >= threshold[0]:
        gc.collect(0)


def solve_watched(
    name: str,
    backend: Backend,
    tables: CostTables,
    hint: Assignment | None,
    deadline: float,
    hard_stop: float,
    on_improvement: ImprovementCallback | None,
    clock: Callable[[], float],
) -> Watched:
    """``backend.solve(tables, options, hint, deadline, on_improvement)`` in a thread, awaited until
    ``hard_stop`` (a ``clock()`` instant; see the module docstring); ``name`` is the backend's name
    for :func:`busy`."""
    signal = StopSignal()
    done = threading.Event()
    box = Watched()
    lock = threading.Lock()

    def run() -> None:
        try:
            with stopping(signal):
                options = tables.problem.options
                result = backend.solve(tables, options, hint, deadline, on_improvement)  # type: ignore[arg-type]
            with lock:
                box.result = result
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread, which decides
            with lock:
                box.error = exc
        finally:
            with lock:
                done.set()
                late = box.stopped
            if late:
                with _lock:
                    _running_late[name] = _running_late.get(name, 1) - 1

    start = clock()
    thread = threading.Thread(target=run, name=f"dhp-solve-{name}", daemon=True)
    thread.start()
    while not done.wait(max(0.0, min(POLL_S, hard_stop - clock()))):
        if hard_stop - clock() > YOUNG_MARGIN_S:
            _collect_young()
        if clock() >= hard_stop:
            with lock:
                if not done.is_set():
                    box.stopped = True
                    with _lock:
                        _running_late[name] = _running_late.get(name, 0) + 1
            break
    if box.stopped:
        signal.set()
        _settle_at_exit()
        return Watched(stopped=True, waited_ms=(clock() - start) * 1000.0)
    if hard_stop - clock() > YOUNG_MARGIN_S:
        _collect_young()
    box.waited_ms = (clock() - start) * 1000.0
    return box
