"""Start a small multi-process job on one machine without torchrun (gloo on CPU, or NCCL on GPUs).

:func:`spawn` runs ``fn(rank, world_size, *args)`` in ``world_size`` processes after initialising
``torch.distributed`` from a file store in a temporary directory (no ports to pick), and returns
each rank's return value. Used by the tests, the example and the profiler's bandwidth probe.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(
    rank: int,
    world_size: int,
    store_path: str,
    backend: str,
    threads: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
) -> None:
    torch.set_num_threads(threads)
    store = dist.FileStore(store_path, world_size)
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        kwargs["device_id"] = torch.device("cuda", rank % torch.cuda.device_count())
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=120), **kwargs
    )
    try:
        results[rank] = ("ok", fn(rank, world_size, *args))
    except BaseException as exc:  # reported to the parent with its traceback
        results[rank] = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        raise
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo", threads: int = 1) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` processes; return their results by rank.

    ``fn`` must be importable (a module-level function); results must be picklable.
    """
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="dhp-store-") as tmp, ctx.Manager() as manager:
        results = manager.dict()
        store_path = os.path.join(tmp, "store")
        procs = [
            ctx.Process(target=_worker, args=(r, world_size, store_path, backend, threads, fn, args, results))
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        errors = [results[r][1] for r in range(world_size) if r in results and results[r][0] == "error"]
        if errors:
            # The first line of each failure, then the full report of the first:
            # a rank's failure often makes its peers fail too.
            heads = "\n".join(
                f"  rank {r}: {results[r][1].splitlines()[0]}"
                for r in range(world_size)
                if r in results and results[r][0] == "error"
            )
            raise RuntimeError(f"{len(errors)} rank(s) failed:\n{heads}\n{errors[0]}")
        bad = [r for r, p in enumerate(procs) if p.exitcode != 0 or r not in results]
        if bad:
            raise RuntimeError(f"ranks {bad} exited with codes {[procs[r].exitcode for r in bad]}")
        return [results[r][1] for r in range(world_size)]
