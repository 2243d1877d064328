"""Running a job: plan the steps the journal lacks on an engine, then write the plan file, the
index and the summary.

``run_job`` may be stopped at any time (``should_stop``, Ctrl-C, a kill): what was planned is in
the journal, and the next run with the same inputs and output directory plans only the rest. The
plan file is written once every step is planned, from the records in step order, so a resumed job
writes the same file as one that ran straight through.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs import planfile
from jobs.engines import Chunk, Engine
from jobs.epoch_summary import summarize
from jobs.steps import Epoch

Progress = Callable[[int, int, int], None]
"""Called with (steps done, total steps, steps failed) after every finished chunk."""


@dataclass
class JobResult:
    status: str
    """``done`` or ``stopped``."""
    directory: Path
    total: int
    done: int
    planned_now: int
    reused: int
    wall_s: float
    index: dict[str, Any] | None = None
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def summary(self) -> dict[str, Any] | None:
        return None if self.index is None else self.index["summary"]


def chunk_size(pending: int, workers: int) -> int:
    """Steps per task: about eight tasks per worker, at most 8 steps each (short tasks balance well
    and lose little when a job stops; a task of a few 10 ms steps amortises the hand-off)."""
    return max(1, min(8, pending // max(1, workers * 8)))


def _error_doc(err: Any) -> dict[str, Any]:
    return {"kind": "invalid", "field": err.field, "message": err.message, "hint": err.hint}


def make_chunks(epoch: Epoch, steps: list[int], size: int) -> list[Chunk]:
    chunks: list[Chunk] = []
    for i in range(0, len(steps), size):
        chunk: list[tuple[int, Sequence[Any], Any]] = []
        for s in steps[i : i + size]:
            bad = epoch.step_error(s)
            chunk.append(
                (s, epoch.step_samples(s), None if bad is None else (epoch.data.sample_id(bad[0]), _error_doc(bad[1])))
            )
        chunks.append(chunk)
    return chunks


def run_job(
    epoch: Epoch,
    out: str | Path,
    engine: Engine,
    *,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    fresh: bool = False,
    keep_journal: bool = False,
    on_records: Callable[[list[dict[str, Any]]], None] | None = None,
) -> JobResult:
    """Plan ``epoch`` into directory ``out`` on ``engine`` (see the module docstring).

    ``on_records`` sees every batch of new records (the service stores them as they come)."""
    start = time.perf_counter()
    directory = Path(out)
    if fresh and directory.exists():
        for name in (planfile.JOURNAL_FILE, planfile.PLAN_FILE, planfile.INDEX_FILE):
            (directory / name).unlink(missing_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    total = len(epoch)
    index = planfile.read_index(directory)
    if (
        index is not None
        and index.get("inputs_hash") == epoch.inputs_hash
        and (directory / planfile.PLAN_FILE).exists()
    ):
        return JobResult("done", directory, total, total, 0, total, time.perf_counter() - start, index)
    journal = planfile.Journal(directory / planfile.JOURNAL_FILE)
    done = journal.load(epoch.inputs_hash, total)
    reused = len(done)
    pending = [s for s in range(total) if s not in done]
    stop = should_stop or (lambda: False)
    failed = sum(1 for r in done.values() if r["status"] != "ok")
    if progress:
        progress(len(done), total, failed)
    journal.open(epoch.inputs_hash, total)
    planned_now = 0
    try:
        chunks = make_chunks(epoch, pending, chunk_size(len(pending), engine.workers))
        for records in engine.map(epoch.spec.template, chunks, stop):
            journal.append(records)
            for r in records:
                done[r["step"]] = r
                failed += r["status"] != "ok"
            planned_now += len(records)
            if on_records:
                on_records(records)
            if progress:
                progress(len(done), total, failed)
    finally:
        journal.close()
    if len(done) < total:
        return JobResult("stopped", directory, total, len(done), planned_now, reused, time.perf_counter() - start)
    records = [done[s] for s in range(total)]
    digest = planfile.write_plan_file(directory / planfile.PLAN_FILE, records)
    wall_s = time.perf_counter() - start
    spec = epoch.spec
    index = {
        "format": planfile.FORMAT,
        "version": planfile.VERSION,
        "plan_file": planfile.PLAN_FILE,
        "plan_file_sha256": digest,
        "inputs_hash": epoch.inputs_hash,
        "steps": total,
        "job": {
            "source": epoch.data.source,
            "samples": len(epoch.data),
            "global_batch_size": spec.global_batch_size,
            "sampler": spec.sampler.__dict__ if spec.batches is None else None,
            "drop_last": spec.drop_last,
            "max_steps": spec.max_steps,
            "template": spec.template,
        },
        "summary": summarize(records),
        "run": {
            **engine.describe(),
            "wall_s": round(wall_s, 3),
            "planned_now": planned_now,
            "reused_from_journal": reused,
            "steps_by_worker": dict(sorted(Counter(r.get("worker", "this process") for r in records).items())),
        },
    }
    planfile.write_index(directory / planfile.INDEX_FILE, index)
    if keep_journal:
        shutil.copyfile(directory / planfile.JOURNAL_FILE, directory / (planfile.JOURNAL_FILE + ".done"))
    journal.remove()
    return JobResult("done", directory, total, total, planned_now, reused, wall_s, index, records)
