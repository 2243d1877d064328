"""Deadline checks for loops of similar steps: a step starts only when the last one would still fit.

A strategy that plans its parts one after another (chunks, segment cuts, long-head candidates)
checks the deadline before each part; a part started just before it runs past it by its whole
length. :class:`Pace` remembers how long the last step took (before the first, the caller's estimate)
and says there is no room for another when that much time is no longer left (no deadline: always
room, so deterministic plans do not change).
"""

from __future__ import annotations

import time


class Pace:
    """The steps of one loop under ``deadline`` (a ``time.perf_counter()`` instant, or None)."""

    def __init__(self, deadline: float | None, first_s: float = 0.0) -> None:
        self.deadline = deadline
        self.last_s = first_s  # the caller's estimate of a first step, until one has been timed
        self._started: float | None = None

    def room(self) -> bool:
        """Whether a step as long as the last one still ends before the deadline (then it starts)."""
        if self.deadline is None:
            return True
        now = time.perf_counter()
        if now + self.last_s > self.deadline:
            return False
        self._started = now
        return True

    def done(self) -> None:
        """The step started by the last :meth:`room` has ended."""
        if self._started is not None:
            self.last_s = time.perf_counter() - self._started
            self._started = None
