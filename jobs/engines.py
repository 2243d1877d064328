"""Where the steps are planned: a local process pool (the default, nothing to run beside it) or
Ray tasks on a Ray cluster (``pip install 'dhp-planner[ray]'``).

An engine takes the job's request template and a list of chunks (a few steps each) and yields the
chunks' records as they finish, in any order; ``should_stop()`` is asked between results, and when
it says so the chunks not started are dropped (a cancelled or interrupted job resumes from its
journal). A chunk whose task dies unexpectedly gives failed records for its steps, never an
exception that loses the others.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from jobs.worker import failed_record, plan_chunk

Chunk = Sequence[tuple[int, Sequence[Any], Any]]
StopCheck = Callable[[], bool]
IN_FLIGHT_PER_WORKER = 2
"""Chunks handed out per worker ahead of need: enough to keep workers busy, few to cancel."""


def _never() -> bool:
    return False


def _lost(chunk: Chunk, exc: BaseException) -> list[dict[str, Any]]:
    error = {
        "kind": "internal",
        "field": None,
        "message": f"the task planning this step died: {type(exc).__name__}: {exc}",
        "hint": "resume the job to plan the step again.",
        "sample": None,
    }
    return [
        failed_record(
            step, [str(s.get("id")) if isinstance(s, dict) else "?" for s in samples], {**error, "step": step}
        )
        for step, samples, _ in chunk
    ]


class Engine:
    name = "engine"
    workers = 1

    def map(
        self, template: dict[str, Any], chunks: Sequence[Chunk], should_stop: StopCheck = _never
    ) -> Iterator[list[dict[str, Any]]]:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "workers": self.workers}


# -- local -------------------------------------------------------------------------------------

_TEMPLATE: dict[str, Any] | None = None


def _init_worker(template: dict[str, Any]) -> None:
    global _TEMPLATE
    _TEMPLATE = template
    from planning.allocator import retain_freed_memory
    from planning.planner import warm_up

    retain_freed_memory()  # a worker process is the planner's own (planning.allocator)
    warm_up()


def _pool_task(chunk: Chunk) -> list[dict[str, Any]]:
    assert _TEMPLATE is not None
    return [{**r, "worker": f"pid {os.getpid()}"} for r in plan_chunk(_TEMPLATE, chunk)]


class LocalEngine(Engine):
    """``workers`` processes on this machine; with one worker the steps are planned in this
    process, unless ``in_process`` is False (the service keeps planning off its own process)."""

    name = "local"

    def __init__(self, workers: int | None = None, in_process: bool | None = None) -> None:
        self.workers = max(1, workers if workers is not None else (os.cpu_count() or 1))
        self.in_process = self.workers == 1 if in_process is None else in_process

    def map(
        self, template: dict[str, Any], chunks: Sequence[Chunk], should_stop: StopCheck = _never
    ) -> Iterator[list[dict[str, Any]]]:
        if self.in_process:
            for chunk in chunks:
                if should_stop():
                    return
                yield plan_chunk(template, chunk)
            return
        # spawn: the workers start clean (no copy of this process's threads or locks)
        pool = ProcessPoolExecutor(
            self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(template,),
        )
        try:
            todo = list(chunks)[::-1]
            running: dict[Future[list[dict[str, Any]]], Chunk] = {}
            while todo or running:
                while todo and len(running) < self.workers * IN_FLIGHT_PER_WORKER and not should_stop():
                    chunk = todo.pop()
                    running[pool.submit(_pool_task, chunk)] = chunk
                if not running:
                    return
                finished, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                for fut in finished:
                    chunk = running.pop(fut)
                    try:
                        yield fut.result()
                    except Exception as exc:  # a worker process died (killed, out of memory)
                        yield _lost(chunk, exc)
                if should_stop():
                    todo.clear()
                    for fut in running:
                        fut.cancel()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


# -- Ray ---------------------------------------------------------------------------------------


def _ray_task(template: dict[str, Any], chunk: Chunk) -> list[dict[str, Any]]:
    """A Ray task: plan the chunk, and note the node that planned it."""
    import ray

    from planning.allocator import retain_freed_memory

    retain_freed_memory()  # Ray's worker process plans only (planning.allocator); once per process
    node = ray.get_runtime_context().get_node_id()[:12]
    return [{**r, "worker": f"node {node}"} for r in plan_chunk(template, chunk)]


class RayEngine(Engine):
    """Ray tasks (one CPU each) on the cluster at ``address`` (``auto``: the one this machine
    belongs to), or on a Ray instance this engine starts (and stops) when there is none.

    The cluster's nodes need this package installed (the workers import :mod:`jobs.worker`)."""

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            from optimizer.errors import ProblemError

            raise ProblemError(
                "Ray is not installed", field="--engine", hint="pip install 'dhp-planner[ray]', or use --engine local."
            ) from None
        self._ray = ray
        self.address = address
        self._started = False
        if not ray.is_initialized():
            kwargs: dict[str, Any] = {"address": address, "include_dashboard": False, "log_to_driver": False}
            if address is None and workers is not None:
                kwargs["num_cpus"] = workers
            try:
                ray.init(**kwargs)
            except ConnectionError as exc:
                from optimizer.errors import ProblemError

                raise ProblemError(
                    f"cannot reach a Ray cluster at {address!r}: {exc}",
                    field="--address",
                    hint="give the head node's address (host:6379), or leave --address out to start a local instance.",
                ) from None
            self._started = True
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = max(1, min(cpus, workers) if workers is not None else cpus)
        self._remote = ray.remote(num_cpus=1, max_retries=1)(_ray_task)

    def describe(self) -> dict[str, Any]:
        nodes = [n for n in self._ray.nodes() if n.get("Alive")]
        return {"engine": self.name, "workers": self.workers, "nodes": len(nodes), "address": self.address}

    def map(
        self, template: dict[str, Any], chunks: Sequence[Chunk], should_stop: StopCheck = _never
    ) -> Iterator[list[dict[str, Any]]]:
        ray = self._ray
        ref = ray.put(template)
        todo = list(chunks)[::-1]
        running: dict[Any, Chunk] = {}
        while todo or running:
            while todo and len(running) < self.workers * IN_FLIGHT_PER_WORKER and not should_stop():
                chunk = todo.pop()
                running[self._remote.remote(ref, chunk)] = chunk
            if not running:
                return
            finished, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
            for obj in finished:
                chunk = running.pop(obj)
                try:
                    yield ray.get(obj)
                except Exception as exc:  # the task or its worker died
                    yield _lost(chunk, exc)
            if should_stop():
                todo.clear()
                for obj in running:
                    ray.cancel(obj, force=True)
                running.clear()

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False


def make_engine(name: str, workers: int | None = None, address: str | None = None) -> Engine:
    if name == "local":
        return LocalEngine(workers)
    if name == "ray":
        return RayEngine(address, workers)
    from optimizer.errors import ProblemError

    raise ProblemError(f"unknown engine {name!r}", field="--engine", hint="use 'local' or 'ray'.")
