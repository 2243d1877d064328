"""Request and response models of the HTTP API, kept apart from the domain types.

The parts of a plan request (``batch``, ``cluster``, ``model``, ``profile``, ``existing_groups``) are
the documents of ``dhp plan`` input files, passed through unchanged to :mod:`api.service.translate`, which
validates them with the same code as the command line (and names the field at fault). These models
describe the envelope and carry the limits that do not depend on the deployment. Every model is strict:
a value of another JSON type than the schema states (``"false"`` for a boolean, ``"4"`` for an integer)
is refused with 422 naming the field, never converted; a JSON integer is still a number.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, create_model

from api.store.repository import SUMMARY_FIELDS, PlanRecord
from optimizer.problem.options import OPTION_SPECS, OptionSpec


def _option_field(spec: OptionSpec) -> tuple[Any, Any]:
    """The pydantic type and field of one planner option, from its one definition."""
    kinds: dict[str, Any] = {"int": int, "number": float, "bool": bool}
    kind: Any = Literal[spec.choices] if spec.choices else kinds.get(spec.kind, str)  # type: ignore[valid-type]
    # NaN and Infinity are named as not finite, not as out of range.
    allow_inf_nan = False if spec.kind == "number" else None
    return kind | None, Field(None, description=spec.help, ge=spec.low, le=spec.high, allow_inf_nan=allow_inf_nan)


OptionsIn = create_model(  # type: ignore[call-overload]
    "OptionsIn",
    __config__=ConfigDict(extra="forbid", strict=True),
    __doc__="Planner options (the ``options`` document of ``dhp plan --options``); leave any out for its default.",
    **{spec.name: _option_field(spec) for spec in OPTION_SPECS},
)


_IMAGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "tokens": {"type": "integer", "minimum": 1, "maximum": 1_000_000_000},
        "frames": {"type": "integer", "minimum": 1, "maximum": 1_000_000_000},
        "tokens_per_frame": {"type": "integer", "minimum": 1, "maximum": 1_000_000_000},
        "width": {"type": "integer", "minimum": 1, "maximum": 1_000_000_000},
        "height": {"type": "integer", "minimum": 1, "maximum": 1_000_000_000},
    },
}
_BATCH_SCHEMA: dict[str, Any] = {
    "required": ["samples"],
    "properties": {
        "samples": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {
                        "anyOf": [{"type": "string", "minLength": 1}, {"type": "integer"}],
                        "description": "an integer is read as its decimal text",
                    },
                    "text_tokens": {"type": "integer", "minimum": 0, "maximum": 1_000_000_000},
                    "images": {"type": "array", "items": _IMAGE_SCHEMA},
                    "videos": {"type": "array", "items": _IMAGE_SCHEMA},
                },
                "additionalProperties": False,
            },
        }
    },
}


def as_sent(schema: dict[str, Any]) -> WithJsonSchema:
    """For ``Annotated[Any, as_sent(schema)]``: a request member that the document reader checks (the code
    that reads the command line's files), so that it reaches that reader as sent instead of converted here
    first; any JSON value, described in the OpenAPI by ``schema`` (or null)."""
    return WithJsonSchema({"anyOf": [schema, {"type": "null"}]})


RankGroups = Annotated[
    Any,
    as_sent({"type": "array", "items": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}}),
]
"""``existing_groups``: a set of rank groups, checked and normalised by
:func:`optimizer.problem.documents.existing_groups_from_json`."""


class PlanRequest(BaseModel):
    """POST /v1/plans. Give ``cluster`` or ``cluster_preset`` and ``model`` or ``model_preset`` (presets default to h100-8x8 and llama3-8b)."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "batch": {
                        "samples": [
                            {"id": "a", "text_tokens": 900, "images": [{"tokens": 576}]},
                            {"id": "b", "text_tokens": 30000},
                        ]
                    },
                    "cluster": {"nodes": 2, "gpus_per_node": 8},
                    "model_preset": "qwen2-vl-7b",
                    "options": {"time_budget_ms": 200, "backend": "heuristic"},
                }
            ]
        },
    )

    batch: dict[str, Any] = Field(
        json_schema_extra=_BATCH_SCHEMA,
        description='the batch document: {"samples": [{"id", "text_tokens", "images": [{"tokens"}], "videos": [...]}]}',
    )
    cluster: dict[str, Any] | None = Field(
        None, description='a cluster document, or the shorthand {"nodes": K, "gpus_per_node": G}'
    )
    cluster_preset: str | None = Field(None, max_length=128, description="a preset cluster name (GET /v1/presets)")
    model: dict[str, Any] | None = Field(None, description="a model document")
    model_preset: str | None = Field(None, max_length=128, description="a preset model name (GET /v1/presets)")
    profile: dict[str, Any] | None = Field(
        None, description="a measured cost profile; replaces the analytical cost model"
    )
    options: OptionsIn | None = None  # type: ignore[valid-type]  # a model derived from PlanOptions
    existing_groups: RankGroups = Field(
        None,
        description="rank groups (communicators) the training job already has: a set, so their order and "
        "the order of each group's ranks do not matter",
    )
    wait: bool = Field(
        True, description="false: plan ahead; answer 202 with the id at once and solve in the background"
    )
    cache: bool = Field(True, description="false: solve again even if an identical request was planned before")


class _PlanFigures(BaseModel):
    """The figures every view of a plan shows (absent while it is being solved)."""

    predicted_step_time_s: float | None = None
    lower_bound_s: float | None = None
    gap: float | None = None


class PlanOut(_PlanFigures):
    """A plan: exactly what ``dhp plan`` prints, plus ``id``, ``status`` and ``created_at``.

    While a plan-ahead request is being solved only ``id``, ``status`` (``pending``) and
    ``created_at`` are present; a failed one carries ``error`` (a problem document).
    """

    model_config = ConfigDict(extra="allow")

    id: str
    status: Literal["pending", "done", "failed"]
    created_at: datetime
    ratio_to_bound: float | None = None
    scheme: str | None = None
    domain_size: int | None = None
    micro_batches: list[dict[str, Any]] | None = None
    communicators: list[list[int]] | None = None
    solver: dict[str, Any] | None = None
    static_baseline: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


PlanSummary = create_model(  # type: ignore[call-overload]
    "PlanSummary",
    __doc__="One stored plan in the plan list: the record's fields without its documents.",
    **{
        name: (hint, ... if name in ("id", "status", "created_at", "n_samples", "n_ranks") else None)
        for name, hint in get_type_hints(PlanRecord).items()
        if name in SUMMARY_FIELDS
    },
)


class PlanList(BaseModel):
    items: list[PlanSummary]  # type: ignore[valid-type]  # a model derived from PlanRecord
    total: int
    limit: int
    offset: int
    next_offset: int | None = Field(None, description="offset of the next page, or null on the last page")


Finite = Annotated[float, Field(allow_inf_nan=False)]


class FeedbackIn(BaseModel):
    """What the trainer measured for a step run with this plan. Numbers must be JSON numbers (not strings), and finite."""

    model_config = ConfigDict(extra="forbid", strict=True)

    measured_step_time_s: float = Field(gt=0, lt=1e7, allow_inf_nan=False, description="wall time of the whole step")
    group_times_s: list[list[Finite]] | None = Field(
        None, max_length=4096, description="per micro-batch, per group (in plan order): measured seconds"
    )
    step: int | None = Field(None, ge=0, description="training step number")
    metrics: dict[Annotated[str, Field(max_length=128)], Finite] | None = Field(
        None, max_length=64, description="other numbers worth keeping (e.g. peak memory)"
    )
    notes: str | None = Field(None, max_length=2000)


class FeedbackOut(BaseModel):
    id: int
    plan_id: str
    created_at: datetime
    measured_step_time_s: float
    predicted_step_time_s: float | None
    measured_over_predicted: float | None = Field(None, description="measured / predicted step time")
    group_times_s: list[list[float]] | None = Field(None, description="per micro-batch, per group, as sent")
    step: int | None = None
    metrics: dict[str, float] | None = None
    notes: str | None = None


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    database: str
    solves_in_flight: int
    queue_depth: int
    capacity: int


class ProblemDetail(BaseModel):
    """An RFC 9457 problem document; ``field`` names the request field at fault, ``hint`` says how to fix it."""

    type: str
    title: str
    status: int
    detail: str
    field: str | None = None
    hint: str | None = None
    instance: str | None = None
