"""One deadline per request: created when the request arrives (HTTP), the process starts (``dhp plan``:
:func:`process_start`) or the call starts (Python), then passed down to every phase, solver and post-step.
Nothing below starts a clock of its own; the engine and the backends receive the absolute
``time.perf_counter()`` instants this object hands out.
"""

from __future__ import annotations

import os
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


def process_start(clock: Callable[[], float] = time.perf_counter) -> float | None:
    """The ``clock()`` instant at which this process started, or None where the system does not say.

    Linux gives a process's start in clock ticks since boot (``/proc/self/stat``, field 22), on the
    clock of ``CLOCK_BOOTTIME``; the instant is ``clock()`` now less the time since then. Ticks are
    whole (10 ms on most systems), so the instant may lie up to one tick early, never late."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            stat = fh.read()
        ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])  # fields after the command's name, from the 3rd
        since_s = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return clock() - since_s if 0.0 <= since_s < 86_400.0 else None
