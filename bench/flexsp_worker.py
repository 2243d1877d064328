"""Child process of :func:`bench.flexsp_real.solve`: runs FlexSP's solver on one batch and writes its groups.

``python -m bench.flexsp_worker JOB.json OUT.json``. The job holds the FlexSP source folder, the
cost-model arguments (:func:`bench.flexsp_real.translation`), the sample lengths (their indices are
the sequence ids), SCIP's time limit per MILP and the process cap. FlexSP's own multiprocessing is
kept but bounded: its per-micro-batch-count processes run one at a time and each pool starts at
most ``workers`` processes (fork start method: the children inherit the imported solver).
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import random
import sys
import time
import types
from pathlib import Path
from typing import Any


def capped_multiprocessing(workers: int, outer: int = 1) -> types.SimpleNamespace:
    """A stand-in for the ``multiprocessing`` module with Pool capped at ``workers`` processes and at most
    ``outer`` started Process objects alive at once (a new start waits for the oldest)."""
    ctx = multiprocessing.get_context("fork")
    live: list[Any] = []

    def pool(processes: int | None = None, *args: Any, **kwargs: Any) -> Any:
        return ctx.Pool(min(processes or workers, workers), *args, **kwargs)

    class Process(ctx.Process):  # type: ignore[name-defined,misc]
        def start(self) -> None:
            while sum(p.is_alive() for p in live) >= outer:
                next(p for p in live if p.is_alive()).join()
            super().start()
            live.append(self)

    return types.SimpleNamespace(Pool=pool, Process=Process, Manager=ctx.Manager)


def run(job: dict[str, Any]) -> dict[str, Any]:
    from bench.flexsp_real import build_optimizer, import_flexsp

    solver = import_flexsp(job["src"])
    utils: Any = importlib.import_module("galvatron.flexsp_solver.multiprocess_utils")
    shim = capped_multiprocessing(int(job["workers"]))
    for module in (solver, utils):  # both call multiprocessing through their module-level name ``mp``
        module.mp = shim
    random.seed(int(job.get("seed", 0)))
    opt = build_optimizer(solver, job["params"], float(job["time_limit_s"]))
    seqs = [solver.Sequence(seq=int(length), id=i) for i, length in enumerate(job["lengths"])]
    start = time.perf_counter()
    groups, results = opt.solve_flexSP_globalbatch_mp_gbmb(
        seqs,
        chunk_alg="sort_consec",
        bucket_alg="dp",
        mb_option_num=int(job["mb_option_num"]),
        bucket_num=int(job["bucket_num"]),
    )
    wall = time.perf_counter() - start
    micro_batches = [[[int(sp), [int(s.id) for s in members]] for sp, members in mb] for mb in groups]
    return {"micro_batches": micro_batches, "solve_wall_s": wall, "flexsp_step_ms": float(sum(r["M"] for r in results))}


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    out = run(job)
    Path(argv[1]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
