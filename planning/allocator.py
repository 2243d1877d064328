"""The planner's own processes keep the memory they free, for their next plan.

A plan of tens of thousands of samples allocates and frees arrays of tens of megabytes many times
(cost matrices, class columns, packings). glibc's allocator serves blocks above its mmap threshold
(128 KiB, rising to at most 32 MiB as such blocks are freed) with fresh pages from the kernel and
hands them back on free, and trims the top of its heap past a threshold; each fresh page costs a
fault on first touch, and on a virtual machine that fault is dear. At 8,192 ranks x 65,536 samples
the heuristic-only call took 572-587 ms with glibc's defaults and 522-546 ms with freed memory kept,
the same plan at the same peak resident size (505 MB); at 64 x 512, 5.6 ms against 4.3 ms in the
median (``python -m bench.scaling --point R S --backend heuristic --table [--glibc-defaults]``, 2-core
development machine).

:func:`retain_freed_memory` raises both thresholds to 1 GiB (``mallopt``), so that freed blocks are
reused within the process. The resident size then stays near the largest plan's peak instead of
falling between plans, which is what a planning process wants. It is called by the processes the
project starts (``dhp``, the service at start-up, epoch workers); a program that calls
:func:`planning.planner.plan` in its own process decides for itself (it is a process-wide setting).
``DHP_RETAIN_FREED_MEMORY=0`` turns it off. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""``mallopt`` parameters (glibc's ``malloc.h``)."""
RETAINED_BYTES = 1 << 30
"""Blocks up to this size come from the heap, and the heap's free top is kept up to this size."""

_applied: bool | None = None


def retain_freed_memory() -> bool:
    """Keep freed memory in the process (see the module docstring); True when the setting is in force.

    Idempotent; False where the C library has no ``mallopt`` (not glibc) or ``DHP_RETAIN_FREED_MEMORY=0``."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get("DHP_RETAIN_FREED_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _applied = bool(mallopt(M_MMAP_THRESHOLD, RETAINED_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, RETAINED_BYTES))
    return _applied


def in_force() -> bool:
    """Whether :func:`retain_freed_memory` has put the setting in force in this process."""
    return bool(_applied)
