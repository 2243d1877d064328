"""Loading the compiled kernels before the first plan's clock starts.

The warm-up switches the kernels (:mod:`optimizer.jit`) to their compiled forms, which are compiled once
per installation and loaded from numba's on-disk cache once per process, the first time each runs: some
30 ms for the first (numba's runtime), 3 to 8 ms for most later ones, up to 40 ms for those whose code
brings in numba's array modules (measured on the 2-core development machine). :func:`warm_up` plans a
few small built-in requests (:func:`warm_up_requests`: ring and Ulysses, one GPU type and mixed, memory
to spare and memory-bound, so that every kernel runs) and is called by :func:`planning.planner.plan`
(through :func:`planning.planner.warm_up`, which hands it the planning function) before its first timed
call, so the caller's time budget is spent on planning, not on loading code. The service calls it at
start-up, a client with a local fallback in a background thread; a plan asked for in another thread
while that runs pauses it after its current request (:func:`warmed`). ``dhp plan``, which plans once in
its process, skips it (``plan(warm=False)``): its budget counts from the process's start, and its plan
runs the kernels' Python forms or loads the compiled ones it runs, as :mod:`planning.kernel_choice`
decides. The fixed work's rates on this machine (:mod:`planning.fixed_work`), which the planner's budget
decisions read, are measured or read from disk within it. Last, what is loaded by then is frozen out of
the cyclic collector (:func:`optimizer.gc_pause.freeze_long_lived`), so that no full collection walks it
within a later plan's budget.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_cond = threading.Condition()
_owner: int | None = None
"""The thread running the warm-up (None before it starts)."""
_ended = threading.Event()
_waiting = 0
"""Timed plans of other threads running or waiting while the warm-up runs: it pauses between requests."""
_in_request = False
"""The warm-up is inside one of its requests (a timed plan waits for that one, not for the rest)."""
last_error: str | None = None
"""Why the warm-up plan failed, if it did (planning goes on: each kernel then loads on first use)."""


def warm_up_requests() -> list[dict]:
    """Small, varied requests that together take the planner down each of its paths.

    Ring and Ulysses, one GPU type and two, any size and powers of two, a batch with room and one
    whose memory binds (a single micro-batch allowed, so packing falls back to memory first), samples
    from one needing a multi-node group to many single-rank ones, and a measured profile with
    bandwidth tables; the group-size LP asked for (``tight_bound``), as an exact backend would run it.
    They go through the public ``plan()``, so code paths added to the planner are loaded here as long
    as one of these problems reaches them.
    """
    lengths = [90_000, 40_000, 20_000, 9_000, 6_000, 3_000, 2_000, 1_500, 1_000, 800, 600, 400, 300, 200, 100, 50]
    samples = [{"id": f"w{i}", "text_tokens": n} for i, n in enumerate(lengths)]
    samples += [
        {"id": "img", "text_tokens": 100, "images": [{"tokens": 576}, {"tokens": 576}]},
        {"id": "vid", "text_tokens": 50, "videos": [{"frames": 16, "tokens_per_frame": 196}]},
    ]
    many = [{"id": f"m{i}", "text_tokens": 64 + (i * 7919) % 6000} for i in range(160)]
    small = [{"id": f"s{i}", "text_tokens": 50 + 37 * i} for i in range(30)]
    tight = [{"id": f"t{i}", "text_tokens": n} for i, n in enumerate([5200, 5000, 3000, 2500, 1200, 900, 400, 300])]
    heuristic = {"backend": "heuristic", "time_budget_ms": 60_000, "tight_bound": True}  # the LP's path too
    profile: dict[str, Any] = {
        "time": {"quadratic": 5e-9, "linear": 1.8e-4, "sample_constant": 0.0, "group_constant": 0.05},
        "comm": {
            "scheme": "ulysses",
            "bytes_per_token": 2e6,
            "bandwidth_bytes_per_s": {
                "intra": {"2": 1.2e11, "4": 1.0e11, "8": 9.6e10},
                "inter": {"16": 1.0e10, "32": 6e9},
            },
        },
        "capacity_tokens_per_rank": 2600,
    }
    return [
        {
            "cluster_preset": "mixed-h100-a100",
            "model_preset": "qwen2-vl-7b",
            "batch": {"samples": samples},
            "options": heuristic,
        },
        {
            "cluster_preset": "h100-8x8",
            "model_preset": "llama3-8b",
            "batch": {"samples": samples + many},
            "options": {**heuristic, "cp_scheme": "ulysses", "degree_policy": "pow2"},
        },
        {
            "cluster": {"nodes": 2, "gpus_per_node": 4},
            "model_preset": "llama3-8b",
            "profile": profile,
            "batch": {"samples": tight},
            "options": {**heuristic, "max_micro_batches": 1},
        },
        {
            "cluster": {
                "nodes": [{"count": 1, "gpus": 4, "gpu": "H100-SXM"}, {"count": 1, "gpus": 4, "gpu": "A100-80GB"}]
            },
            "model_preset": "llama3-8b",
            "profile": {**profile, "comm": {**profile["comm"], "scheme": "ring"}, "speed_by_gpu": {"A100-80GB": 0.6}},
            "batch": {"samples": tight + small},
            "options": {**heuristic, "max_micro_batches": 3},
        },
    ]


def ended() -> bool:
    """Whether this process's warm-up has run to its end."""
    return _ended.is_set()


def _claim() -> bool:
    """Whether this thread is to run the warm-up (the first to ask, once per process)."""
    global _owner
    with _cond:
        if _owner is None:
            _owner = threading.get_ident()
            return True
        return False


def warm_up_with(plan: Callable[[Any], Any]) -> float:
    """Run every kernel once in this process by planning the warm-up requests with ``plan`` (no-op
    after the first call); returns the milliseconds spent. A call from another thread while the
    warm-up runs waits for it to end; a timed plan does not (:func:`warmed`)."""
    if _ended.is_set():
        return 0.0
    if _claim():
        try:
            return _warm_up(plan)
        finally:
            _ended.set()
    if _owner != threading.get_ident():
        _ended.wait()
    return 0.0


@contextmanager
def warmed(plan: Callable[[Any], Any]) -> Iterator[None]:
    """Around a timed plan, before its clock starts: the warm-up in this thread when none has run
    (:func:`warm_up_with`); while another thread's warm-up runs (a client's, started when it was made),
    that warm-up pauses after its current request until this plan ends, and the plan loads what it
    runs and is not loaded yet within its own budget, as ``dhp plan`` does. So a client's first local
    plan asked for during the warm-up waits for one warm-up request, not for all of them."""
    global _waiting
    if _ended.is_set() or _owner == threading.get_ident():  # warmed, or a plan of the warm-up itself
        yield
        return
    if _owner is None:
        warm_up_with(plan)  # this thread's, whole; waits for another's that started meanwhile
    if _ended.is_set():
        yield
        return
    with _cond:
        _waiting += 1
        _cond.wait_for(lambda: not _in_request)
    try:
        yield
    finally:
        with _cond:
            _waiting -= 1
            _cond.notify_all()


@contextmanager
def _request() -> Iterator[None]:
    """One step of the warm-up, started once no timed plan is running or waiting (:func:`warmed`)."""
    global _in_request
    with _cond:
        _cond.wait_for(lambda: _waiting == 0)
        _in_request = True
    try:
        yield
    finally:
        with _cond:
            _in_request = False
            _cond.notify_all()


def _warm_up(plan: Callable[[Any], Any]) -> float:
    """Plan the warm-up requests with ``plan``, then measure or read the fixed work's rates; the milliseconds
    spent (what failed is in :data:`last_error`)."""
    global last_error
    start = time.perf_counter()
    from optimizer import jit
    from optimizer.gc_pause import freeze_long_lived
    from optimizer.problem.documents import problem_from_json

    jit.load()  # a process that warms up plans again: the compiled kernels pay (optimizer.jit)

    errors = []
    for doc in warm_up_requests():
        with _request():
            try:
                problem = problem_from_json(doc)
                plan(problem)
            except Exception as exc:  # never let the warm-up stop a real plan
                errors.append(f"{type(exc).__name__}: {exc}")
    with _request():
        try:  # the best-placement table, read by the exact backends' bounds
            from optimizer.costs.tables import CostTables

            _ = CostTables.build(problem).best_time
        except Exception as exc:  # noqa: BLE001 - as above
            errors.append(f"{type(exc).__name__}: {exc}")
    from planning import fixed_work

    with _request():
        fixed_work.rates()  # measured by now (the first plan's budget check asks for them); never raises
    if fixed_work.last_error:
        errors.append(f"measuring the fixed work: {fixed_work.last_error}")
    with _request():
        freeze_long_lived()  # what is loaded by now lives as long as the process (optimizer.gc_pause)
    last_error = "; ".join(errors) or None
    return (time.perf_counter() - start) * 1000.0
