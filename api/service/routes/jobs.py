"""/v1/jobs: plan a whole epoch ahead in the background (see :mod:`api.service.jobs_service`).

``POST /v1/jobs`` takes the job document of ``dhp plan-epoch --job`` (samples inline: the service
reads no server-side paths) and answers 202 with the job's id; ``GET /v1/jobs/{id}`` gives done,
failed, total and the ETA, then the epoch summary; ``POST /v1/jobs/{id}/cancel`` stops it (the
planned steps are kept), ``POST /v1/jobs/{id}/resume`` plans the rest; each step's plan is in the
plan store as ``GET /v1/plans/{id}-{step:06d}``, and ``GET /v1/jobs/{id}/plan-file`` returns the
Parquet plan file once the job is done.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Path, Request
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field

from api.service.deps import SettingsDep, require_token
from api.service.intake import ParsedOffLoop
from api.service.problem_details import ServiceError
from api.service.routes.plans import _ERRORS, NOT_FOUND, learned_profile, problem_responses
from api.service.schemas import ClusterMember, ModelMember, ProfileMember, RankGroups, as_sent
from api.service.settings import Settings
from api.store.repository import is_id
from jobs.spec import MAX_WORKERS
from optimizer.errors import ProblemError

MAX_RUNNING_JOBS = 2
"""Jobs one server process runs at once; more are refused with 503 and Retry-After."""


async def _job_id(job_id: Annotated[str, Path(description="the id POST /v1/jobs returned")]) -> str:
    if not is_id(job_id):  # no job has such an id: not looked up
        raise _not_found(job_id)
    return job_id


JobId = Annotated[str, Depends(_job_id)]


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    manager = getattr(app.state, "jobs", None)
    if manager is not None:  # running jobs stop where they are; POST /v1/jobs/{id}/resume goes on
        await asyncio.to_thread(manager.close)


router = APIRouter(
    prefix="/v1",
    tags=["jobs"],
    dependencies=[Depends(require_token)],
    responses=_ERRORS,
    lifespan=_lifespan,
    route_class=ParsedOffLoop,
)


class JobRequest(BaseModel):
    """The job document of ``dhp plan-epoch --job`` with the samples inline, and the worker count.

    Strict like the plan request: the members of the job document reach :func:`jobs.spec.job_from_json` as
    sent (the reader of ``--job`` files, so a file and a body are held to one rule), ``workers`` is an integer."""

    model_config = ConfigDict(extra="forbid", strict=True)

    dataset: dict[str, Any] | None = Field(
        None, description='{"samples": [...]}: the samples of the epoch, as in a batch document'
    )
    batches: list[dict[str, Any]] | None = Field(None, description="or explicit batches, one step each")
    global_batch_size: Annotated[Any, as_sent({"type": "integer", "minimum": 1})] = Field(
        None, description="samples per step (with dataset)"
    )
    sampler: dict[str, Any] | str | None = Field(
        None, description='{"kind": "sequential" | "shuffle" | "length-grouped", "seed", "epoch", "group_batches"}'
    )
    drop_last: Annotated[Any, as_sent({"type": "boolean"})] = Field(
        None, description="drop a last step shorter than the global batch size"
    )
    max_steps: Annotated[Any, as_sent({"type": "integer", "minimum": 1})] = Field(
        None, description="plan only the first N steps"
    )
    cluster: ClusterMember = None
    cluster_preset: str | None = None
    model: ModelMember = None
    model_preset: str | None = None
    profile: ProfileMember = None
    options: dict[str, Any] | None = Field(
        None, description="as in a plan request; jobs default to the heuristic (deterministic plans)"
    )
    existing_groups: RankGroups = None
    workers: int = Field(
        1, ge=1, le=MAX_WORKERS, description="processes planning the job (1: a thread of the server process)"
    )


class JobOut(BaseModel):
    id: str
    status: str = Field(
        description="running, cancelling, cancelled, interrupted (its process went away: resume it), done or failed"
    )
    total: int
    done: int
    failed: int
    eta_s: float | None = Field(None, description="seconds left at the current rate")
    workers: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    plan_ids: str = Field(description="the id of step k's plan in the plan store")
    summary: dict[str, Any] | None = Field(None, description="the epoch summary, once done")
    error: dict[str, Any] | None = None


def _manager(request: Request) -> Any:
    try:
        import pyarrow  # noqa: F401  (the plan file)

        from api.service.jobs_service import JobManager
    except ImportError:
        raise ServiceError(
            501,
            "Jobs not installed",
            "this server lacks the jobs extra",
            kind="not-installed",
            hint="pip install 'dhp-planner[jobs]' on the server.",
        ) from None
    state = request.app.state
    if getattr(state, "jobs", None) is None:
        state.jobs = JobManager(state.store, state.settings.data_dir)
    return state.jobs


def _out(state: Any) -> JobOut:
    return JobOut(
        id=state.id,
        status=state.status,
        total=state.total,
        done=state.done,
        failed=state.failed,
        eta_s=state.eta_s,
        workers=state.workers,
        created_at=state.created_at,
        updated_at=state.updated_at,
        finished_at=state.finished_at,
        plan_ids=f"{state.id}-{{step:06d}}",
        summary=state.summary,
        error=state.error,
    )


def _not_found(job_id: str) -> ServiceError:
    return ServiceError(
        404,
        "Not found",
        f"no job with id {job_id!r}",
        kind="not-found",
        field="job_id",
        hint="use an id returned by POST /v1/jobs.",
    )


def _within_limits(doc: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The job document with the service's limits applied (per step as for POST /v1/plans)."""
    from api.service import translate
    from jobs.spec import JOB_BUDGET_MS, job_from_json

    options = dict(doc.get("options") or {})
    if options.get("backend", "heuristic") == "heuristic":
        options.setdefault("time_budget_ms", min(JOB_BUDGET_MS, settings.max_budget_ms))
    doc = {**doc, "options": options}
    spec = job_from_json(doc, allow_path=False)
    size = spec.global_batch_size or max(
        len(b.get("samples") or []) if isinstance(b, dict) and isinstance(b.get("samples"), list) else 0
        for b in spec.batches or [{}]
    )
    if size > settings.max_samples:
        raise ProblemError(
            f"steps of {size} samples are more than this service's limit of {settings.max_samples}",
            field="global_batch_size" if spec.global_batch_size else "batches",
            hint="plan smaller steps, or raise DHP_MAX_SAMPLES on the server.",
        )
    translate.to_problem({**spec.template, "batch": {"samples": [{"id": "probe", "text_tokens": 1}]}}, settings)
    return doc


@router.post("/jobs", status_code=202, response_model=JobOut, summary="Plan every step of an epoch in the background")
async def create_job(body: JobRequest, request: Request, settings: SettingsDep) -> JobOut:
    """Checks the job document (422 naming the field), records the job and starts it; poll ``GET /v1/jobs/{id}``."""
    manager = _manager(request)
    if body.workers > (os.cpu_count() or 1):
        raise ProblemError(
            f"is {body.workers}, more than this server's {os.cpu_count()} CPUs",
            field="workers",
            hint="ask for fewer workers.",
        )
    if manager.running >= MAX_RUNNING_JOBS:
        raise ServiceError(
            503,
            "Service at capacity",
            f"{MAX_RUNNING_JOBS} jobs are running in this server process",
            kind="overloaded",
            hint=f"retry after {settings.retry_after_s} s.",
            headers={"Retry-After": str(settings.retry_after_s)},
        )
    sent = body.model_dump(exclude_none=True, exclude={"workers"})
    if isinstance(sent.get("profile"), str):  # "learned:NAME": the job plans every step with what it names now
        sent["profile"] = await asyncio.to_thread(learned_profile, request.app.state.store, sent["profile"])
    doc = _within_limits(sent, settings)
    state = await asyncio.to_thread(manager.start, doc, body.workers)
    return _out(state)


async def _existing(call: Callable[[str], Any], job_id: str) -> Any:
    """``call(job_id)`` off the event loop; 404 when it finds no such job."""
    state = await asyncio.to_thread(call, job_id)
    if state is None:
        raise _not_found(job_id)
    return state


@router.get(
    "/jobs/{job_id}",
    response_model=JobOut,
    summary="A job's progress (done, failed, total, ETA) and, once done, its summary",
    responses=NOT_FOUND,
)
async def get_job(job_id: JobId, request: Request) -> JobOut:
    return _out(await _existing(_manager(request).state, job_id))


@router.post(
    "/jobs/{job_id}/cancel",
    status_code=202,
    response_model=JobOut,
    summary="Stop a running job (the steps planned so far are kept)",
    responses=NOT_FOUND,
)
async def cancel_job(job_id: JobId, request: Request) -> JobOut:
    return _out(await _existing(_manager(request).cancel, job_id))


@router.post(
    "/jobs/{job_id}/resume",
    status_code=202,
    response_model=JobOut,
    summary="Plan the steps a cancelled or interrupted job still lacks",
    responses=NOT_FOUND,
)
async def resume_job(job_id: JobId, request: Request) -> JobOut:
    manager = _manager(request)
    state = await _existing(manager.state, job_id)
    if state.status in ("cancelled", "interrupted", "failed"):
        state = await asyncio.to_thread(manager.resume, job_id)
    return _out(state)


@router.get(
    "/jobs/{job_id}/plan-file",
    summary="The job's Parquet plan file (once done)",
    responses={
        200: {"content": {"application/vnd.apache.parquet": {}}, "description": "plan.parquet"},
        **NOT_FOUND,
        **problem_responses((409, "the job is not done yet")),
    },
)
async def plan_file(job_id: JobId, request: Request) -> FileResponse:
    manager = _manager(request)
    state = await _existing(manager.state, job_id)
    path = manager.directory(job_id) / "plan.parquet"
    if state.status != "done" or not path.exists():
        raise ServiceError(
            409,
            "Job not done",
            f"the job is {state.status}",
            kind="job-not-done",
            field="job_id",
            hint="wait until GET /v1/jobs/{id} says done (the file is written once every step is planned).",
        )
    return FileResponse(path, media_type="application/vnd.apache.parquet", filename=f"{job_id}.parquet")
