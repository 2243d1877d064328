"""One deadline per request: created when the request arrives (HTTP) or the call starts (CLI, Python),
then passed down to every phase, solver and post-step. Nothing below starts a clock of its own; the
engine and the backends receive the absolute ``time.perf_counter()`` instants this object hands out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Deadline:
    """A time budget: ``start`` and ``due`` are ``clock()`` instants in seconds."""

    start: float
    due: float
    clock: Callable[[], float] = time.perf_counter

    @classmethod
    def after_ms(
        cls, budget_ms: float, start: float | None = None, clock: Callable[[], float] = time.perf_counter
    ) -> Deadline:
        """A budget of ``budget_ms`` from ``start`` (a ``clock()`` instant; now when omitted)."""
        begin = clock() if start is None else start
        return cls(begin, begin + budget_ms / 1000.0, clock)

    @property
    def budget_ms(self) -> float:
        return (self.due - self.start) * 1000.0

    def at(self, share: float) -> float:
        """The instant ``share`` of the budget after the start."""
        return self.start + share * (self.due - self.start)

    def left_ms(self) -> float:
        """Milliseconds until the deadline (negative once past)."""
        return (self.due - self.clock()) * 1000.0

    def elapsed_ms(self) -> float:
        return (self.clock() - self.start) * 1000.0

    def expired(self) -> bool:
        return self.clock() >= self.due
