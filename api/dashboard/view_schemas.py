"""Response and request models of the dashboard's JSON endpoints (``/v1/dashboard/...``), for the OpenAPI document."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from api.service.schemas import OptionsIn, record_model
from api.store.queries import TABLE_FIELDS

PlanTableRow = record_model(
    "PlanTableRow",
    TABLE_FIELDS,
    "One row of the plans table.",
    measured_step_time_s=(
        float | None,
        Field(None, description="mean of the measured step times in the plan's feedback"),
    ),
    feedback_count=(int, 0),
    backend_asked=(str, Field("auto", description="the backend the request asked for ('auto' when it named none)")),
    profile_name=(
        str,
        Field(
            "analytical",
            description="the profile's name: 'analytical', the zoo preset whose source it carries, or its short source",
        ),
    ),
)


class PlanTable(BaseModel):
    items: list[PlanTableRow]  # type: ignore[valid-type]  # a model derived from PlanRecord
    total: int
    limit: int
    offset: int
    sort: str
    order: str
    next_offset: int | None = Field(None, description="offset of the next page, or null on the last page")


class Facets(BaseModel):
    status: list[str]
    backend: list[str]
    cluster: list[str]
    model: list[str]
    profile: list[str] = Field(description="profiles of plans with feedback: 'analytical' or the profile's source")
    profile_names: dict[str, str] = Field(
        default_factory=dict, description="the name shown for each of 'profile' (a zoo preset's, or a short source)"
    )


class Changes(BaseModel):
    """A cheap stamp of the store's contents: poll it and re-read the table when it changes."""

    plans: int
    by_status: dict[str, int]
    feedback: int
    latest_plan_at: datetime | None = None
    latest_feedback_id: int | None = None


class GanttGroup(BaseModel):
    index: int
    ranks: list[int]
    spans: list[list[int]] = Field(
        description="the group's ranks as half-open runs [first, last+1) of consecutive ranks"
    )
    degree: int
    samples: list[str]
    predicted_time_s: float
    idle_s: float = Field(description="time the group's ranks wait for the micro-batch's slowest group")
    intra_node: bool
    nodes: list[int] = Field(description="nodes the group's ranks are on (empty when the cluster could not be read)")
    measured_time_s: float | None = Field(None, description="from the newest feedback with group_times_s")


class GanttMicroBatch(BaseModel):
    index: int
    start_s: float
    predicted_time_s: float
    idle_rank_s: float = Field(description="rank-seconds spent waiting in this micro-batch, unused ranks included")
    unused_ranks: list[int]
    groups: list[GanttGroup]


class Gantt(BaseModel):
    domain_size: int
    step_s: float
    nodes: list[list[int]] = Field(description="per node, the half-open range of its ranks")
    node_gpus: list[str] = Field(
        [], description="per node, the name of its GPU type (empty when the cluster could not be read)"
    )
    utilisation: float = Field(description="busy rank-seconds over domain_size x step")
    micro_batches: list[GanttMicroBatch]


class FeedbackPoint(BaseModel):
    id: int
    created_at: datetime
    measured_step_time_s: float
    predicted_step_time_s: float | None = None
    step: int | None = None
    group_times_s: list[list[float]] | None = None
    notes: str | None = None


class PlanView(BaseModel):
    """What the one-plan page shows."""

    model_config = ConfigDict(extra="allow")

    id: str
    status: str
    created_at: datetime
    cluster: str | None = None
    model: str | None = None
    profile: str = Field(description="'analytical' or the profile's source")
    profile_name: str = Field(description="the profile's name: 'analytical', a zoo preset's name, or its short source")
    backend_asked: str = Field(description="the backend the request asked for ('auto' when it named none)")
    n_samples: int
    n_ranks: int
    options: dict[str, Any] = Field(description="the options the request gave")
    budget_ms: float
    predicted_step_time_s: float | None = None
    lower_bound_s: float | None = None
    ratio_to_bound: float | None = None
    gap: float | None = None
    scheme: str | None = None
    static_baseline: dict[str, Any] | None = None
    solver: dict[str, Any] | None = Field(
        None, description="backend, status, wall_ms, trace, phases (ms), fallback_reason, bound"
    )
    communicators: list[list[int]] = []
    new_communicators: list[list[int]] | None = None
    gantt: Gantt | None = None
    feedback: list[FeedbackPoint] = []
    error: dict[str, Any] | None = None


class ReplanIn(BaseModel):
    """Options that replace the stored request's options for one re-plan (the rest of the request is kept)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"options": {"backend": "cpsat", "time_budget_ms": 500}}]}
    )

    options: OptionsIn = Field(default_factory=lambda: OptionsIn.model_validate({}))


class ReplanOut(BaseModel):
    """The outcome of planning the stored request again with other options (not stored)."""

    plan_id: str
    options: dict[str, Any] = Field(
        description="the whole options document used: copy it into a request to get this plan"
    )
    predicted_step_time_s: float
    lower_bound_s: float
    ratio_to_bound: float
    gap: float
    backend: str
    solver_status: str
    fallback_reason: str | None = None
    planner_ms: float = Field(description="wall time of the whole planning call, measured by the service")
    solver_wall_ms: float
    micro_batches: int
    groups: int
    largest_group: int
    static_speedup: float | None = None
    trace: list[dict[str, float | None]] = Field(
        [], description="the solver's anytime trace: elapsed_ms, objective_s, bound_s (null while it has none)"
    )


class CalibrationPoint(BaseModel):
    feedback_id: int
    plan_id: str
    predicted_step_time_s: float
    measured_step_time_s: float
    ratio: float = Field(description="measured / predicted")
    group: int = Field(description="index of the point's profile and cluster in 'groups'")


class CalibrationGroup(BaseModel):
    profile: str = Field(description="'analytical' or the profile's source (the value of the 'profile' filter)")
    profile_name: str = Field(description="the name shown: 'analytical', a zoo preset's name, or a short source")
    cluster: str | None = None
    n: int
    median_ratio: float
    mean_abs_error: float = Field(description="mean of |measured / predicted - 1|")
    p90_abs_error: float
    verdict: str = Field(description="ok, watch (median error above 5%) or re-profile (above 10%, at least 3 points)")


class Histogram(BaseModel):
    edges: list[float] = Field(
        description="bin edges of measured / predicted - 1; the outer bins also hold what lies beyond them"
    )
    counts: list[int]


class Calibration(BaseModel):
    points: list[CalibrationPoint] = Field(description="the newest feedback points (at most the 'limit' asked for)")
    total: int = Field(
        description="feedback points matching the filters; 'groups', 'histogram' and 'overall' cover all of them"
    )
    groups: list[CalibrationGroup]
    histogram: Histogram
    overall: CalibrationGroup | None = None
