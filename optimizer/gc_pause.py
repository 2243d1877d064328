"""Pausing Python's cyclic garbage collector while a plan is built.

A plan for tens of thousands of samples allocates hundreds of thousands of small objects (tuples of
ranks and sample indices, group plans) that all live until the plan is returned and form no
reference cycles. The cyclic collector would traverse them again and again as they are allocated
(measured: 30 ms of work becoming 125 ms at 65536 samples). Reference counting still frees
everything as usual; the collector resumes when the last concurrent planning call ends. While an
exact solver runs, the planning layer collects the youngest generation itself (solver libraries build
objects with reference cycles, which must not pile up for the whole budget); :func:`collector_running`
lets the collector run fully for a stretch inside a pause.

What is alive once a process has warmed up (code, the numerical and solver libraries, their caches)
lives as long as the process, yet every full collection walks it: 30 to 35 ms once the planner's
kernels are loaded, 86 ms seen as a 1 s plan ended beside its stopped solver's thread (the 2-core
development machine), enough to carry a plan past its budget when it falls as the pause ends.
:func:`freeze_long_lived` (called at the end of the warm-up) moves it out of the collector's reach for
good (``gc.freeze``), after which a full collection walks only what was made since: under 0.1 ms
after the warm-up. A pause during which modules were imported (a solver library loaded by the first
plan that needs it: 42,000 objects) freezes what is alive when it ends, for the same reason; the
cyclic garbage of that one plan is then never collected.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False
_modules = 0
"""Modules loaded when the outermost pause began."""


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable the cyclic collector for the duration; nested and concurrent uses are counted."""
    global _depth, _was_enabled, _modules
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            _modules = len(sys.modules)
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                if len(sys.modules) > _modules:
                    gc.freeze()  # the modules loaded meanwhile live as long as the process
                if _was_enabled:
                    gc.enable()


def freeze_long_lived() -> None:
    """Collect, then keep every object alive now out of all later collections (see the module docstring).
    For a process's start-up, before any plan's clock runs: the collection takes tens of milliseconds."""
    gc.collect()
    gc.freeze()


@contextmanager
def collector_running() -> Iterator[None]:
    """Inside :func:`collector_paused`: let the collector run for the duration (counted like a pause ending)."""
    global _depth, _was_enabled
    with _lock:
        _depth -= 1
        if _depth == 0 and _was_enabled:
            gc.enable()
    try:
        yield
    finally:
        with _lock:
            if _depth == 0:
                _was_enabled = gc.isenabled()
                gc.disable()
            _depth += 1
