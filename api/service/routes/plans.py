"""/v1/plans: plan now or ahead, read plans back, list them, and store trainer feedback."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BeforeValidator

from api.service import translate
from api.service.deps import ArrivalDep, ServiceDep, SettingsDep, StoreDep, require_token
from api.service.intake import ParsedOffLoop, for_body
from api.service.problem_details import ServiceError
from api.service.schemas import (
    FeedbackIn,
    FeedbackOut,
    PlanList,
    PlanOut,
    PlanRequest,
    ProblemDetail,
    plan_summary,
)
from api.store import Store
from api.store.learned_profiles import NAME, PREFIX, get_profile
from api.store.repository import is_id
from optimizer.errors import ProblemError

TEXT_PATTERN = r"^[^\x00-\x1f\x7f]*$"
"""Text that may reach the database: no NUL or other control characters."""


def text_query(max_length: int, description: str | None = None) -> Any:
    """A text filter: at most ``max_length`` characters, none of them a control character (422 naming the parameter)."""
    return Query(max_length=max_length, pattern=TEXT_PATTERN, description=description)


async def _plan_id(plan_id: Annotated[str, Path(description="the id POST /v1/plans returned")]) -> str:
    if not is_id(plan_id):  # no stored plan has such an id: not looked up
        raise _not_found(plan_id)
    return plan_id


PlanId = Annotated[str, Depends(_plan_id)]
_ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ProblemDetail, "content": {"application/problem+json": {}}, "description": d}
    for s, d in (
        (401, "missing or wrong bearer token"),
        (413, "body too large"),
        (422, "invalid or unsatisfiable request; names the field"),
        (503, "at capacity; retry after the Retry-After seconds"),
    )
}


def problem_responses(*statuses: tuple[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for problem documents a route answers with."""
    return {
        s: {"model": ProblemDetail, "content": {"application/problem+json": {}}, "description": d} for s, d in statuses
    }


NOT_FOUND = problem_responses((404, "no such id (an id that cannot exist is not looked up)"))
router = APIRouter(
    prefix="/v1", tags=["plans"], dependencies=[Depends(require_token)], responses=_ERRORS, route_class=ParsedOffLoop
)


def _not_found(plan_id: str) -> ServiceError:
    return ServiceError(
        404,
        "Not found",
        f"no plan with id {plan_id!r}",
        kind="not-found",
        field="plan_id",
        hint="use an id returned by POST /v1/plans (GET /v1/plans lists them).",
    )


def _plan_response(
    record: Any,
    status: int,
    cached: bool | None = None,
    timings: dict[str, float] | None = None,
    note: str | None = None,
) -> Response:
    headers = {"Location": f"/v1/plans/{record.id}"}
    if cached is not None:
        headers["X-Plan-Cache"] = "hit" if cached else "miss"
    if timings:
        headers["Server-Timing"] = ", ".join(f"{k};dur={v:.3f}" for k, v in timings.items())
    body = translate.plan_body(record, note)
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def learned_profile(store: Store, reference: str) -> dict[str, Any]:
    """The profile document a request's ``"profile": "learned:NAME"`` names (422 naming ``profile`` when none)."""
    name = reference.removeprefix(PREFIX)
    learned = get_profile(store, name) if NAME.match(name) else None
    if learned is None:
        raise ServiceError(
            422,
            "Invalid request",
            f"no learned profile named {name!r}",
            kind="invalid-request",
            field="profile",
            hint="name one POST /v1/profiles/fit returned (GET /v1/profiles lists them), or send the profile document.",
        )
    return learned.profile


@router.post(
    "/plans",
    status_code=201,
    response_model=PlanOut,
    summary="Plan a batch (now, or ahead with wait=false)",
    responses={
        200: {"model": PlanOut, "description": "an identical request was planned before (plan cache)"},
        202: {"model": PlanOut, "description": "plan-ahead: accepted and pending; poll GET /v1/plans/{id}"},
    },
)
async def create_plan(
    body: PlanRequest, service: ServiceDep, store: StoreDep, arrived: ArrivalDep, request: Request
) -> Response:
    """Return the verified plan (201), the cached plan of an identical request (200), or with
    ``"wait": false`` the pending plan's id at once (202). The time budget counts from arrival.
    The ``Server-Timing`` header says where the time went: queue, translate, solve, encode, store, handoff, app (ms)."""
    if isinstance(body.profile, str):
        body = body.model_copy(update={"profile": await run_in_threadpool(learned_profile, store, body.profile)})
    doc, raw = await for_body(len(await request.body()), translate.read_request, body)  # raw: the request as sent
    note = translate.model_note(doc)
    if body.wait:
        record, cached, timings = await service.plan(doc, arrived, body.cache, raw)
        return _plan_response(record, 200 if cached else 201, cached, timings, note)
    record, cached = await service.plan_ahead(doc, arrived, body.cache, raw)
    return _plan_response(record, 200 if cached else 202, cached, note=note)


@router.get(
    "/plans/{plan_id}",
    response_model=PlanOut,
    summary="A plan and its status, optionally waiting for a pending one",
    responses=NOT_FOUND,
)
async def get_plan(
    plan_id: PlanId,
    service: ServiceDep,
    settings: SettingsDep,
    wait_ms: Annotated[int, Query(ge=0, le=600_000, description="wait up to this long while the plan is pending")] = 0,
) -> Response:
    record = await service.get(plan_id, min(wait_ms, settings.long_poll_max_ms))
    if record is None:
        raise _not_found(plan_id)
    return _plan_response(record, 200)


def _utc(value: datetime | None, field: str) -> datetime | None:
    if value is None:
        return None
    try:
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    except (OverflowError, ValueError):
        raise ServiceError(
            422,
            "Invalid request",
            "is out of range",
            kind="invalid-request",
            field=field,
            hint="give a date between years 1 and 9999 (UTC).",
        ) from None


DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}")


def _date_time(value: Any) -> Any:
    """A date and time as the OpenAPI says (RFC 3339), not a number of seconds or a bare date."""
    if isinstance(value, str) and not DATE_TIME.match(value):
        raise ValueError("give an ISO 8601 date and time, e.g. 2026-01-31T12:00:00Z")
    return value


@dataclass(frozen=True)
class PlanFilterArgs:
    """The filters of a plan listing, as the query gives them (times in UTC)."""

    status: str | None
    backend: str | None
    cluster: str | None
    model: str | None
    created_after: datetime | None
    created_before: datetime | None


def plan_filter_args(
    status: Annotated[Literal["pending", "done", "failed"] | None, Query()] = None,
    backend: Annotated[str | None, text_query(32)] = None,
    cluster: Annotated[str | None, text_query(128)] = None,
    model: Annotated[str | None, text_query(128)] = None,
    created_after: Annotated[
        datetime | None, BeforeValidator(_date_time), Query(description="ISO 8601 date and time; inclusive")
    ] = None,
    created_before: Annotated[
        datetime | None, BeforeValidator(_date_time), Query(description="ISO 8601 date and time; exclusive")
    ] = None,
) -> PlanFilterArgs:
    """The filter query parameters every plan listing takes (the plan list and the dashboard's table)."""
    return PlanFilterArgs(
        status, backend, cluster, model, _utc(created_after, "created_after"), _utc(created_before, "created_before")
    )


PlanFilterDep = Annotated[PlanFilterArgs, Depends(plan_filter_args)]


@router.get("/plans", response_model=PlanList, summary="List plans, newest first")
def list_plans(
    store: StoreDep,
    filters: PlanFilterDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
) -> PlanList:
    items, total = store.search(**asdict(filters), limit=limit, offset=offset)
    nxt = offset + len(items) if offset + len(items) < total else None
    return PlanList(items=[plan_summary(r) for r in items], total=total, limit=limit, offset=offset, next_offset=nxt)


def _check_group_times(group_times: list[list[float]] | None, plan_json: str | None) -> None:
    """Per-group times must follow the plan's shape: one list per micro-batch, one number per group."""
    if group_times is None or not plan_json:
        return
    plan = json.loads(plan_json)
    mbs = plan.get("micro_batches", [])
    if len(group_times) != len(mbs):
        raise ProblemError(
            f"has {len(group_times)} micro-batches, the plan has {len(mbs)}",
            field="group_times_s",
            hint="give one list per micro-batch, in plan order.",
        )
    for m, (times, mb) in enumerate(zip(group_times, mbs, strict=True)):
        if len(times) != len(mb.get("groups", [])):
            raise ProblemError(
                f"has {len(times)} groups, the plan's micro-batch has {len(mb.get('groups', []))}",
                field=f"group_times_s[{m}]",
                hint="give one time per group, in plan order.",
            )
        for g, t in enumerate(times):
            if not (t >= 0 and t < 1e7):
                raise ProblemError(
                    f"must be a time in seconds >= 0, got {t!r}",
                    field=f"group_times_s[{m}][{g}]",
                    hint="give measured seconds.",
                )


def _feedback_out(fb: Any) -> FeedbackOut:
    ratio = fb.measured_step_time_s / fb.predicted_step_time_s if fb.predicted_step_time_s else None
    sent = {k: fb.document[k] for k in ("group_times_s", "step", "metrics", "notes") if k in fb.document}
    return FeedbackOut(
        id=fb.id,
        plan_id=fb.plan_id,
        created_at=fb.created_at,
        measured_step_time_s=fb.measured_step_time_s,
        predicted_step_time_s=fb.predicted_step_time_s,
        measured_over_predicted=ratio,
        **sent,
    )


@router.post(
    "/plans/{plan_id}/feedback",
    status_code=201,
    response_model=FeedbackOut,
    summary="Store what the trainer measured",
    responses={
        **NOT_FOUND,
        **problem_responses((409, "the plan is not done yet")),
        200: {
            "model": FeedbackOut,
            "description": "the same feedback sent again with its Idempotency-Key: stored once, the stored record",
        },
    },
)
def add_feedback(
    plan_id: PlanId,
    body: FeedbackIn,
    store: StoreDep,
    service: ServiceDep,
    request: Request,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            max_length=64,
            pattern=r"^[\x21-\x7e]+$",
            description="the same key on a retried POST: the feedback is stored once "
            "and the retry answers 200 with the stored record",
        ),
    ] = None,
) -> FeedbackOut:
    """Kept beside the plan's prediction; ``group_times_s`` must follow the plan's micro-batches and groups."""
    record = store.get(plan_id)
    if record is None:
        raise _not_found(plan_id)
    if record.status != "done":
        raise ServiceError(
            409,
            "Plan not ready",
            f"the plan is {record.status}",
            kind="plan-not-done",
            field="plan_id",
            hint="send feedback for a finished plan (GET /v1/plans/{id}?wait_ms=... waits for it).",
        )
    _check_group_times(body.group_times_s, record.plan_json)
    document = body.model_dump(exclude_none=True)
    fb = store.add_feedback(plan_id, body.measured_step_time_s, document, idempotency_key)
    if fb is None:
        raise _not_found(plan_id)
    if fb.replayed and fb.document != document:  # a key names one request: another body under it is a client's mistake
        raise ServiceError(
            422,
            "Idempotency-Key reused",
            "this Idempotency-Key was sent before with another feedback body; the first one is kept",
            kind="idempotency-key-reused",
            field="Idempotency-Key",
            hint="send a new key with each new measurement, and the very same body when retrying one.",
        )
    if fb.replayed:
        response.status_code = 200
        return _feedback_out(fb)
    if fb.predicted_step_time_s:
        service.metrics.prediction_ratio.observe(fb.measured_step_time_s / fb.predicted_step_time_s)
    auto = getattr(request.app.state, "auto_refit", None)
    if auto is not None:
        auto.after_feedback(record, body.group_times_s is not None)
    return _feedback_out(fb)


@router.get(
    "/plans/{plan_id}/feedback",
    response_model=list[FeedbackOut],
    summary="Feedback stored for a plan",
    responses=NOT_FOUND,
)
def list_feedback(plan_id: PlanId, store: StoreDep) -> list[FeedbackOut]:
    if store.get(plan_id, with_documents=False) is None:
        raise _not_found(plan_id)
    return [_feedback_out(fb) for fb in store.feedback_for(plan_id)]
