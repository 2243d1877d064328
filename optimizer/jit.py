"""Compiled loops: each kernel runs as plain Python until the process loads numba, compiled after.

The planner's per-sample loops (the LPT placement of short samples, the static layout's balancing,
the verifier's recomputation, ...) live in the ``*_kernels`` modules
(:mod:`optimizer.heuristic.lpt_kernels`, :mod:`optimizer.heuristic.static_kernels`,
:mod:`optimizer.verify.verify_kernels` and their siblings) as :class:`Kernel` objects. A kernel runs
its Python function (or a numpy form of it given as ``python=``) until :func:`load` is called, and
numba's ``njit`` form of it after; both give the same results, which the tests check. numba is a
dependency of the package; without it, or with ``NUMBA_DISABLE_JIT=1``, :func:`load` leaves the
Python forms in place.

Why loading waits: importing numba and its LLVM library takes about 0.3 s of a fresh process on the
2-core development machine, more than planning a batch of a few hundred samples with the Python
forms takes. A process that plans once, small (``dhp plan``), keeps the Python forms; the planning
layer loads numba for larger batches and longer budgets (:func:`planning.kernel_choice.wants_compiled`),
and a long-lived process (the service, a client's local fallback) loads it in its warm-up.

Compiled code is cached on disk (``cache=True``), so only the first process after an install pays
the compilation (about a second per kernel); set ``NUMBA_CACHE_DIR`` where the installed package's
folder is not writable. Loading a kernel from that cache takes the machine code as it was compiled:
numba's own cache first installs every typing and lowering registry of its compiler (150 to 280 ms
on the first kernel a process loads, some 5 ms more on each later one, measured on the 2-core
development machine), which only compiling needs. The kernels here load with numba's runtime alone
(:class:`_QuickLoad`: about 30 ms for the first, 2 to 5 ms for most later ones), and a kernel that has
to be compiled still gets the whole compiler, which installs the registries itself.

A kernel that calls another names it as a module global, as any function does: compiled, numba
types that global by the callee's compiled form (:attr:`Kernel._numba_type_`).
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Callable
from typing import Any


def _numba_found() -> bool:
    try:
        return importlib.util.find_spec("numba") is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a broken install
        return False


HAVE_NUMBA = _numba_found() and os.environ.get("NUMBA_DISABLE_JIT", "0") in ("", "0")
"""Whether :func:`load` compiles: numba installed and not disabled by ``NUMBA_DISABLE_JIT``."""

_lock = threading.RLock()
_kernels: list[Kernel] = []
_loaded = False
_quick_load: Any = None
load_error: str | None = None
"""Why numba could not be imported when :func:`load` asked for it (the Python forms then stay), or None."""


class Kernel:
    """One compiled loop: ``py_func`` (numba's name for it) and, once :func:`load` has run, its numba
    dispatcher. Calling it calls whichever form is current."""

    def __init__(
        self, fn: Callable[..., Any], python: Callable[..., Any] | None = None, error_model: str | None = None
    ) -> None:
        self.py_func = fn
        self.error_model = error_model
        """numba's ``error_model`` for this kernel (None: numba's default, ``"python"``); ``"numpy"`` drops
        the zero test of every division, for loops whose divisors cannot be zero."""
        self.python = python or fn
        """What runs before :func:`load`: ``fn``, or a numpy form with the same results."""
        self.impl: Callable[..., Any] = self.python
        self._dispatcher: Any = None
        self.__name__ = fn.__name__
        self.__qualname__ = fn.__qualname__
        self.__module__ = fn.__module__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(self, *args: Any) -> Any:
        return self.impl(*args)

    def __repr__(self) -> str:
        form = "compiled" if self._dispatcher is not None else "python"
        return f"<kernel {self.__module__}.{self.__qualname__} ({form})>"

    @property
    def dispatcher(self) -> Any:
        """numba's dispatcher of ``py_func`` (made on first use, numba loaded then), or None without numba."""
        global load_error
        if self._dispatcher is None and HAVE_NUMBA and load_error is None:
            with _lock:
                if self._dispatcher is None and load_error is None:
                    try:
                        self._dispatcher = _njit_of(self.py_func, error_model=self.error_model)
                    except ImportError as exc:  # a numba that will not import: the Python forms stay
                        load_error = f"{type(exc).__name__}: {exc}"
        return self._dispatcher

    @property
    def _numba_type_(self) -> Any:
        """How numba types this kernel where compiled code calls it: as its dispatcher."""
        return self.dispatcher._numba_type_

    def _use_compiled(self) -> None:
        dispatcher = self.dispatcher
        if dispatcher is not None:
            self.impl = dispatcher


def compiled(
    fn: Callable[..., Any] | None = None, *, python: Callable[..., Any] | None = None, error_model: str | None = None
) -> Any:
    """``fn`` as a :class:`Kernel` (``@compiled``, or ``@compiled(python=numpy_form, error_model=...)``)."""
    if fn is None:
        return lambda f: compiled(f, python=python, error_model=error_model)
    kernel = Kernel(fn, python, error_model)
    with _lock:
        _kernels.append(kernel)
        if _loaded:
            kernel._use_compiled()
    return kernel


def loaded() -> bool:
    """Whether this process runs the compiled forms (:func:`load` has run and numba imported)."""
    return _loaded and HAVE_NUMBA and load_error is None


def load() -> bool:
    """Switch every kernel, and every one made later, to its compiled form (imports numba the first time);
    whether the kernels now run compiled. Each kernel's machine code is still loaded (or compiled) on its
    first call."""
    global _loaded
    with _lock:
        if not _loaded:
            for kernel in _kernels:
                kernel._use_compiled()
            _loaded = True
    return loaded()


def _njit_of(fn: Callable[..., Any], njit: Callable[..., Any] | None = None, error_model: str | None = None) -> Any:
    """numba's ``njit`` of ``fn`` with the disk cache, loaded by :class:`_QuickLoad` where this numba has the
    cache class expected. Where no cache directory is writable (a read-only install without a writable home
    or ``NUMBA_CACHE_DIR``), the kernel is compiled without the disk cache: every process then compiles it
    again, but planning works. ``njit``: numba's, unless another is given (the tests give one);
    ``error_model``: numba's option of that name, when given."""
    if njit is None:
        from numba import njit as numba_njit

        njit = numba_njit
    make: Callable[..., Any] = njit
    options: dict[str, Any] = {"nogil": True} if error_model is None else {"nogil": True, "error_model": error_model}
    try:
        kernel = make(cache=True, **options)(fn)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return make(**options)(fn)
    quick = _quick_loader()
    cache = getattr(kernel, "_cache", None)
    if quick is not None and type(cache) is quick.__base__:
        cache.__class__ = quick
    return kernel


def _quick_loader() -> Any:
    """:class:`_QuickLoad`, defined on first use (it subclasses numba's cache), or None for another numba."""
    global _quick_load
    if _quick_load is None:
        try:
            from numba.core.caching import FunctionCache
            from numba.core.runtime import nrt
        except ImportError:  # pragma: no cover - another numba layout: its own cache loading stands
            _quick_load = False
            return None

        class _QuickLoad(FunctionCache):  # type: ignore[misc]
            """numba's on-disk cache of one kernel, loading a cached overload with the runtime (NRT)
            initialised rather than the compiler's registries (see the module docstring); a load that
            fails so goes the whole way, registries first."""

            def load_overload(self, sig: Any, target_context: Any) -> Any:
                try:
                    nrt.rtsys.initialize(target_context)
                    return self._load_overload(sig, target_context)
                except Exception:  # noqa: BLE001 - numba's own load decides what the error is
                    return super().load_overload(sig, target_context)

        _quick_load = _QuickLoad
    return _quick_load or None
