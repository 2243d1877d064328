"""Compiled loops: numba's ``njit`` when it is installed, plain Python otherwise.

The planner's per-sample loops (the LPT placement of short samples, the static layout's balancing,
the verifier's recomputation, ...) run under ``njit`` in the ``*_kernels`` modules
(:mod:`optimizer.heuristic.lpt_kernels`, :mod:`optimizer.heuristic.static_kernels`,
:mod:`optimizer.verify.verify_kernels` and their siblings). numba is a dependency of the package;
without it (or with ``NUMBA_DISABLE_JIT=1``) the same functions run as ordinary Python, with the
same results, only slower. Compiled code is cached on disk (``cache=True``), so only the first
process after an install pays the compilation (about a second per kernel); set ``NUMBA_CACHE_DIR``
where the installed package's folder is not writable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])

_njit: Any
try:  # pragma: no cover - exercised by whichever branch the environment takes
    from numba import njit as _njit

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover
    _njit = None
    HAVE_NUMBA = False


def compiled(fn: F) -> F:
    """``fn`` compiled in nopython mode with an on-disk cache, or ``fn`` itself without numba.

    Where no cache directory is writable (a read-only install without a writable home or
    ``NUMBA_CACHE_DIR``), the kernel is compiled without the disk cache: every process then
    compiles it again, but planning works.
    """
    if _njit is None:
        return fn
    try:
        return cast(F, _njit(cache=True, nogil=True)(fn))
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return cast(F, _njit(nogil=True)(fn))
