"""Compiled loops: numba's ``njit`` when it is installed, plain Python otherwise.

The planner's per-sample loops (the LPT placement of short samples, the static layout's balancing,
the verifier's recomputation, ...) run under ``njit`` in the ``*_kernels`` modules
(:mod:`optimizer.heuristic.lpt_kernels`, :mod:`optimizer.heuristic.static_kernels`,
:mod:`optimizer.verify.verify_kernels` and their siblings). numba is a dependency of the package;
without it (or with ``NUMBA_DISABLE_JIT=1``) the same functions run as ordinary Python, with the
same results, only slower. Compiled code is cached on disk (``cache=True``), so only the first
process after an install pays the compilation (about a second per kernel); set ``NUMBA_CACHE_DIR``
where the installed package's folder is not writable.

Loading a kernel from that cache takes the machine code as it was compiled: numba's own cache first
installs every typing and lowering registry of its compiler (150 to 280 ms on the first kernel a
process loads, some 5 ms more on each later one, measured on the 2-core development machine), which
only compiling needs. The kernels here load with numba's runtime alone (:class:`_QuickLoad`: about
30 ms for the first, 2 to 5 ms for most later ones), and a kernel that has to be compiled still gets
the whole compiler, which installs the registries itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])

_njit: Any
_quick_load: Any = None
try:  # pragma: no cover - exercised by whichever branch the environment takes
    from numba import njit as _njit

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover
    _njit = None
    HAVE_NUMBA = False

if _njit is not None:  # pragma: no branch - numba's cache class, where this numba has the one expected
    try:
        from numba.core.caching import FunctionCache
        from numba.core.runtime import nrt
    except ImportError:  # pragma: no cover - another numba layout: its own cache loading stands
        pass
    else:

        class _QuickLoad(FunctionCache):  # type: ignore[misc]
            """numba's on-disk cache of one kernel, loading a cached overload with the runtime
            (NRT) initialised rather than the compiler's registries (see the module docstring); a
            load that fails so goes the whole way, registries first."""

            def load_overload(self, sig: Any, target_context: Any) -> Any:
                try:
                    nrt.rtsys.initialize(target_context)
                    return self._load_overload(sig, target_context)
                except Exception:  # noqa: BLE001 - numba's own load decides what the error is
                    return super().load_overload(sig, target_context)

        _quick_load = _QuickLoad


def compiled(fn: F) -> F:
    """``fn`` compiled in nopython mode with an on-disk cache, or ``fn`` itself without numba.

    Where no cache directory is writable (a read-only install without a writable home or
    ``NUMBA_CACHE_DIR``), the kernel is compiled without the disk cache: every process then
    compiles it again, but planning works.
    """
    if _njit is None:
        return fn
    try:
        kernel = _njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return cast(F, _njit(nogil=True)(fn))
    cache = getattr(kernel, "_cache", None)
    if _quick_load is not None and type(cache) is _quick_load.__base__:
        cache.__class__ = _quick_load
    return cast(F, kernel)
