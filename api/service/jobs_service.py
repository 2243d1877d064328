"""Epoch jobs in the planning service: the ``jobs`` table, and the manager that runs jobs in the
background (one thread each, planning on a local process pool so the server stays responsive).

Every step's plan goes into the plan store as it is planned, under the id ``<job id>-<step>``
(``GET /v1/plans/{id}`` reads it); the plan file and its index are written under
``<data dir>/jobs/<job id>/``. Progress (done, failed, total) is written to the job's row after
every chunk, so any server process can answer ``GET /v1/jobs/{id}``; a cancel is a flag on the
row that the running job reads. A job whose process went away is reported ``interrupted`` and can
be resumed: its journal (in the job's directory) keeps the steps already planned.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Boolean, Column, DateTime, Integer, MetaData, String, Table, Text, insert, select, update

from api.store.repository import PlanRecord, Store, utcnow

log = logging.getLogger("api.service.jobs_service")
metadata = MetaData()
JOBS = Table(
    "jobs",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("created_at", DateTime(timezone=True), nullable=False, index=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True)),
    Column("status", String(16), nullable=False, index=True),
    Column("total", Integer, nullable=False),
    Column("done", Integer, nullable=False),
    Column("failed", Integer, nullable=False),
    Column("run_started_at", DateTime(timezone=True)),
    Column("run_done_at_start", Integer, nullable=False),
    Column("cancel_requested", Boolean, nullable=False),
    Column("workers", Integer, nullable=False),
    Column("request_json", Text, nullable=False),
    Column("summary_json", Text),
    Column("error_json", Text),
)
"""Changes go with a migration in ``api/store/migrations/versions`` (0002_jobs created it)."""
STALE_S = 30.0
"""A running job whose row was not touched for this long belongs to a process that went away."""
HEARTBEAT_S = 5.0
"""How often a running job touches its row while no step finishes."""
ACTIVE = ("running", "cancelling")


@dataclass(frozen=True)
class JobState:
    id: str
    status: str
    total: int
    done: int
    failed: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    run_started_at: datetime | None
    run_done_at_start: int
    workers: int
    summary: dict[str, Any] | None
    error: dict[str, Any] | None

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the rate of the current run (None before a step of it is done, 0 when finished)."""
        if self.status == "done":
            return 0.0
        if self.status not in ACTIVE or self.run_started_at is None:
            return None
        planned = self.done - self.run_done_at_start
        elapsed = (self.updated_at - self.run_started_at).total_seconds()
        if planned <= 0 or elapsed <= 0:
            return None
        return (self.total - self.done) * elapsed / planned


def _aware(value: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; every stored time is UTC.
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


def plan_id(job_id: str, step: int) -> str:
    return f"{job_id}-{step:06d}"


class JobStore:
    def __init__(self, store: Store) -> None:
        self.engine = store.engine

    def add(self, job_id: str, total: int, workers: int, request: dict[str, Any]) -> None:
        now = utcnow()
        with self.engine.begin() as conn:
            conn.execute(
                insert(JOBS),
                [
                    dict(
                        id=job_id,
                        created_at=now,
                        updated_at=now,
                        status="running",
                        total=total,
                        done=0,
                        failed=0,
                        run_started_at=now,
                        run_done_at_start=0,
                        cancel_requested=False,
                        workers=workers,
                        request_json=json.dumps(request, separators=(",", ":")),
                    )
                ],
            )

    def get(self, job_id: str) -> JobState | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(JOBS).where(JOBS.c.id == job_id)).first()
        if row is None:
            return None
        state = JobState(
            id=row.id,
            status=row.status,
            total=row.total,
            done=row.done,
            failed=row.failed,
            created_at=_aware(row.created_at),  # type: ignore[arg-type]
            updated_at=_aware(row.updated_at),  # type: ignore[arg-type]
            finished_at=_aware(row.finished_at),
            run_started_at=_aware(row.run_started_at),  # type: ignore[arg-type]
            run_done_at_start=row.run_done_at_start,
            workers=row.workers,
            summary=json.loads(row.summary_json) if row.summary_json else None,
            error=json.loads(row.error_json) if row.error_json else None,
        )
        return state

    def request(self, job_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            text = conn.execute(select(JOBS.c.request_json).where(JOBS.c.id == job_id)).scalar()
        return json.loads(text) if text else None

    def set(self, job_id: str, **values: Any) -> None:
        with self.engine.begin() as conn:
            conn.execute(update(JOBS).where(JOBS.c.id == job_id).values(updated_at=utcnow(), **values))

    def cancel_requested(self, job_id: str) -> bool:
        with self.engine.connect() as conn:
            return bool(conn.execute(select(JOBS.c.cancel_requested).where(JOBS.c.id == job_id)).scalar())


def _step_record(
    job_id: str,
    record: dict[str, Any],
    template: dict[str, Any],
    samples: list[Any],
    n_ranks: int,
    names: tuple[str, str],
) -> PlanRecord:
    request = {**template, "batch": {"samples": samples}}
    text = json.dumps(request, separators=(",", ":"), sort_keys=True)
    now = utcnow()
    base: dict[str, Any] = dict(
        id=plan_id(job_id, record["step"]),
        created_at=now,
        finished_at=now,
        request_hash=hashlib.sha256(text.encode()).hexdigest(),
        request_json=text,
        n_samples=len(samples),
        n_ranks=n_ranks,
        cluster=names[0],
        model=names[1],
    )
    if record["status"] == "ok":
        solver = json.loads(record["plan"])["solver"]
        return PlanRecord(
            status="done",
            plan_json=record["plan"],
            backend=solver["backend"],
            solver_status=solver["status"],
            predicted_step_time_s=record["predicted_step_time_s"],
            lower_bound_s=record["lower_bound_s"],
            gap=record["gap"],
            solve_ms=record.get("wall_ms"),
            **base,
        )
    err = record["error"]
    doc = {
        "type": "https://dhp-planner.dev/problems/"
        + ("infeasible" if err["kind"] == "infeasible" else "invalid-request"),
        "title": "Plan failed",
        "status": 422,
        "detail": err["message"],
        "field": err.get("field"),
        "hint": err.get("hint"),
        "sample": err.get("sample"),
        "step": record["step"],
    }
    return PlanRecord(status="failed", error_json=json.dumps(doc), **base)


class JobManager:
    """Runs the jobs this process accepted (see the module docstring)."""

    def __init__(self, store: Store, data_dir: Path) -> None:
        self.store = store
        self.jobs = JobStore(store)
        self.data_dir = data_dir
        self._threads: dict[str, threading.Thread] = {}
        self._stop: dict[str, threading.Event] = {}
        self._closing = threading.Event()

    @property
    def running(self) -> int:
        """Jobs running in this process."""
        return len(self._threads)

    def directory(self, job_id: str) -> Path:
        return self.data_dir / "jobs" / job_id

    def start(self, doc: dict[str, Any], workers: int) -> JobState:
        """Validate the job document (raises ProblemError naming the field), record the job and start it."""
        from jobs.spec import job_from_json
        from jobs.steps import build_epoch

        epoch = build_epoch(job_from_json(doc, allow_path=False))
        job_id = uuid.uuid4().hex[:20]
        self.jobs.add(job_id, len(epoch), workers, doc)
        self._launch(job_id, epoch, workers)
        state = self.jobs.get(job_id)
        assert state is not None
        return state

    def resume(self, job_id: str) -> JobState | None:
        from jobs.spec import job_from_json
        from jobs.steps import build_epoch

        state = self.state(job_id)
        if state is None or state.status in ACTIVE or state.status == "done":
            return state
        doc = self.jobs.request(job_id)
        assert doc is not None
        epoch = build_epoch(job_from_json(doc, allow_path=False))
        self.jobs.set(
            job_id,
            status="running",
            cancel_requested=False,
            finished_at=None,
            run_started_at=utcnow(),
            run_done_at_start=state.done,
        )
        self._launch(job_id, epoch, state.workers)
        return self.jobs.get(job_id)

    def cancel(self, job_id: str) -> JobState | None:
        state = self.state(job_id)
        if state is None or state.status not in ACTIVE:
            return state
        self.jobs.set(job_id, cancel_requested=True, status="cancelling")
        event = self._stop.get(job_id)
        if event is not None:
            event.set()
        return self.jobs.get(job_id)

    def state(self, job_id: str) -> JobState | None:
        state = self.jobs.get(job_id)
        if state is not None and state.status in ACTIVE and job_id not in self._threads:
            if (utcnow() - state.updated_at).total_seconds() > STALE_S:
                self.jobs.set(job_id, status="interrupted")
                state = self.jobs.get(job_id)
        return state

    def _launch(self, job_id: str, epoch: Any, workers: int) -> None:
        stop = threading.Event()
        self._stop[job_id] = stop
        thread = threading.Thread(
            target=self._run, args=(job_id, epoch, workers, stop), name=f"dhp-job-{job_id}", daemon=True
        )
        self._threads[job_id] = thread
        thread.start()

    def _run(self, job_id: str, epoch: Any, workers: int, stop: threading.Event) -> None:
        from jobs.engines import LocalEngine
        from jobs.runner import run_job
        from optimizer.errors import PlannerError
        from optimizer.problem.documents import problem_from_json

        template = epoch.spec.template
        probe = problem_from_json({**template, "batch": {"samples": [{"id": "probe", "text_tokens": 1}]}})
        names = (template.get("cluster_preset") or probe.cluster.name, template.get("model_preset") or probe.model.name)
        last_check = [time.monotonic()]

        def should_stop() -> bool:
            if stop.is_set() or self._closing.is_set():
                return True
            if time.monotonic() - last_check[0] > 1.0:  # a cancel sent to another server process
                last_check[0] = time.monotonic()
                if self.jobs.cancel_requested(job_id):
                    stop.set()
            return stop.is_set()

        def store_records(records: list[dict[str, Any]]) -> None:
            for r in records:
                if self.store.get(plan_id(job_id, r["step"]), with_documents=False) is None:
                    self.store.add(
                        _step_record(
                            job_id, r, template, epoch.step_samples(r["step"]), probe.cluster.total_gpus, names
                        )
                    )

        def progress(done: int, total: int, failed: int) -> None:
            self.jobs.set(job_id, done=done, failed=failed)

        engine = LocalEngine(workers)  # one worker: this thread plans, as the service's solve threads do
        finished = threading.Event()

        def heartbeat() -> None:  # long steps must not make the job look abandoned (STALE_S)
            while not finished.wait(HEARTBEAT_S):
                self.jobs.set(job_id)

        threading.Thread(target=heartbeat, name=f"dhp-job-{job_id}-heartbeat", daemon=True).start()
        try:
            result = run_job(
                epoch,
                self.directory(job_id),
                engine,
                progress=progress,
                should_stop=should_stop,
                on_records=store_records,
            )
            if result.status == "done":
                assert result.index is not None
                self.jobs.set(
                    job_id,
                    status="done",
                    finished_at=utcnow(),
                    done=result.total,
                    summary_json=json.dumps(result.index["summary"]),
                )
            else:
                self.jobs.set(
                    job_id,
                    status="cancelled" if stop.is_set() and not self._closing.is_set() else "interrupted",
                    finished_at=utcnow(),
                )
        except PlannerError as exc:
            self.jobs.set(
                job_id,
                status="failed",
                finished_at=utcnow(),
                error_json=json.dumps({"field": exc.field, "detail": exc.message, "hint": exc.hint}),
            )
        except Exception as exc:
            log.exception("job %s failed", job_id)
            self.jobs.set(
                job_id,
                status="failed",
                finished_at=utcnow(),
                error_json=json.dumps({"detail": f"{type(exc).__name__} while planning"}),
            )
        finally:
            finished.set()
            engine.close()
            self._threads.pop(job_id, None)
            self._stop.pop(job_id, None)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the running jobs (they stay resumable) and wait for their threads."""
        self._closing.set()
        for thread in list(self._threads.values()):
            thread.join(timeout_s)
