"""Asking an exact solve that is still running to stop.

The planning layer runs each backend's ``solve`` in a thread of its own and stops waiting for it at
the deadline (:mod:`planning.solve_watch`). It then sets that solve's :class:`StopSignal`, so that
the solve does not go on using the machine for an answer nobody reads. The signal belongs to the
thread the solve runs in (:func:`current_stop`): the built-in backends look it up and register what
ends their work early (CP-SAT's ``stop_search``, the end of the neighbourhood rounds, the CBC
process), so the backend interface needs no argument for it. A backend that never looks is still
stopped from the planner's point of view (its answer is no longer awaited); it only runs on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class StopSignal:
    """Set once, from any thread; callbacks registered with :meth:`on_stop` run when it is set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._hooks: list[Callable[[], object]] = []

    def is_set(self) -> bool:
        return self._set

    def on_stop(self, hook: Callable[[], object]) -> Callable[[], None]:
        """Run ``hook`` when the signal is set (now, when it is already); returns a function that
        unregisters it (call it once the work ``hook`` would stop has ended)."""
        with self._lock:
            if not self._set:
                self._hooks.append(hook)
                return lambda: self._discard(hook)
        hook()
        return lambda: None

    def _discard(self, hook: Callable[[], object]) -> None:
        with self._lock:
            if hook in self._hooks:
                self._hooks.remove(hook)

    def set(self) -> None:
        with self._lock:
            if self._set:
                return
            self._set = True
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            try:
                hook()
            except Exception:  # noqa: BLE001 - work that ended meanwhile may refuse to be stopped; nothing to do then
                pass


_local = threading.local()


def current_stop() -> StopSignal | None:
    """The stop signal of the solve running in this thread (None outside :func:`stopping`)."""
    return getattr(_local, "signal", None)


def stop_requested() -> bool:
    signal = current_stop()
    return signal is not None and signal.is_set()


class Stopped(Exception):
    """Raised by :func:`check_stop` in a solve asked to stop (caught by the backend that checks)."""


def check_stop(count: int, every: int = 32) -> None:
    """In a long loop building a model: raise :class:`Stopped` at every ``every``-th ``count`` when
    this thread's solve has been asked to stop."""
    if count % every == 0 and stop_requested():
        raise Stopped("stopped at the deadline")


@contextmanager
def stopping(signal: StopSignal) -> Iterator[StopSignal]:
    """Make ``signal`` this thread's :func:`current_stop` for the duration."""
    before = current_stop()
    _local.signal = signal
    try:
        yield signal
    finally:
        _local.signal = before
