"""Request and response models of the HTTP API, kept apart from the domain types.

The parts of a plan request (``batch``, ``cluster``, ``model``, ``profile``, ``existing_groups``) are the
documents of ``dhp plan`` input files: they reach :mod:`api.service.translate` as sent and are read there by
the same code as the command line's files (which names the field at fault and says how to fix it). Their
JSON Schemas in the OpenAPI document come from the models :mod:`api.service.document_models` builds from the
documents'
definitions (:mod:`optimizer.problem.definitions`), which refuse what the reader refuses. The ``options`` are
checked here, by :data:`OptionsIn` (built from the options' definitions the same way), once: the request
document carries what they were read into (:class:`~optimizer.problem.options.CheckedOptions`). Every model is
strict: a value of another JSON type than the schema states (``"false"`` for a boolean, ``"4"`` for an
integer) is refused with 422 naming the field, never converted; a JSON integer is still a number.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from datetime import datetime
from typing import Annotated, Any, Literal, get_type_hints

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    WrapValidator,
    create_model,
)
from pydantic_core import PydanticCustomError

from api.service.document_models import document_model, member_schema
from api.store.repository import SUMMARY_FIELDS, PlanRecord
from optimizer.problem.definitions import REQUEST
from optimizer.problem.options import OPTIONS, CheckedOptions, PlanOptions


def _object(value: Any) -> Any:
    if value is not None and not isinstance(value, dict):
        raise PydanticCustomError("dict_type", "Input should be a valid dictionary")
    return value


def as_sent(schema: dict[str, Any], required: bool = False) -> Any:
    """For ``Annotated[Any, as_sent(schema)]``: a request member that the document reader checks (the code that reads
    the command line's files), so that it reaches that reader as sent instead of converted here first; described in
    the OpenAPI by ``schema`` (or null, unless ``required``)."""
    return WithJsonSchema(schema if required else {"anyOf": [schema, {"type": "null"}]})


BatchMember = Annotated[Any, PlainValidator(_object), as_sent(member_schema("batch"), required=True)]
"""``batch``: a JSON object passed on as sent (read by :func:`optimizer.problem.documents.batch_from_json`)."""
ClusterMember = Annotated[Any, PlainValidator(_object), as_sent(member_schema("cluster"))]
ModelMember = Annotated[Any, PlainValidator(_object), as_sent(member_schema("model"))]
LEARNED_PROFILE = r"^learned:[A-Za-z0-9][A-Za-z0-9._-]{0,159}$"
"""A reference to a profile the service learned (``POST /v1/profiles/fit``): ``learned:KEY.vN`` or ``learned:KEY``."""


def _profile(value: Any) -> Any:
    """A profile document, or a reference to a learned profile (resolved by the plans route)."""
    if isinstance(value, str):
        if not re.match(LEARNED_PROFILE, value):
            raise PydanticCustomError(
                "profile_reference", "a profile given as text must be 'learned:NAME' (GET /v1/profiles lists them)"
            )
        return value
    return _object(value)


ProfileMember = Annotated[
    Any,
    PlainValidator(_profile),
    WithJsonSchema(
        {"anyOf": [member_schema("profile"), {"type": "string", "pattern": LEARNED_PROFILE}, {"type": "null"}]}
    ),
]
"""``profile``: a profile document passed on as sent, or ``"learned:NAME"`` naming a learned profile."""
RankGroups = Annotated[Any, as_sent(member_schema("existing_groups"))]
"""``existing_groups``: a set of rank groups, checked and normalised by
:func:`optimizer.problem.documents.existing_groups_from_json`."""
OptionsIn = document_model(OPTIONS, "OptionsIn")
"""The planner options (the ``options`` document of ``dhp plan --options``), from their definitions."""


def _checked_options(value: Any, handler: ValidatorFunctionWrapHandler) -> CheckedOptions | None:
    """A body's options checked by :data:`OptionsIn` and kept as sent, with the options they read into."""
    model = handler(value)
    if model is None:
        return None
    sent = value if isinstance(value, dict) else model.model_dump(exclude_none=True)
    values = {name: getattr(model, name) for name in model.model_fields_set if getattr(model, name) is not None}
    return CheckedOptions({k: v for k, v in sent.items() if v is not None}, PlanOptions.checked(**values))


class PlanRequest(BaseModel):
    """POST /v1/plans. Give ``cluster`` or ``cluster_preset`` and ``model`` or ``model_preset`` (presets default to
    h100-8x8 and llama3-8b)."""

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

    batch: BatchMember = Field(description=REQUEST["batch"].help)
    cluster: ClusterMember = Field(None, description=REQUEST["cluster"].help)
    cluster_preset: str | None = Field(None, max_length=128, description=REQUEST["cluster_preset"].help)
    model: ModelMember = Field(None, description=REQUEST["model"].help)
    model_preset: str | None = Field(None, max_length=128, description=REQUEST["model_preset"].help)
    profile: ProfileMember = Field(None, description=REQUEST["profile"].help)
    options: Annotated[OptionsIn | None, WrapValidator(_checked_options)] = Field(  # type: ignore[valid-type]
        None, description=REQUEST["options"].help
    )
    existing_groups: RankGroups = Field(None, description=REQUEST["existing_groups"].help)
    wait: bool = Field(True, description=REQUEST["wait"].help)
    cache: bool = Field(True, description=REQUEST["cache"].help)


def record_model(name: str, names: tuple[str, ...], doc: str, **extra: Any) -> type[BaseModel]:
    """A model of the stored record's fields ``names`` (types, defaults and descriptions from
    :class:`~api.store.models.PlanRecord`), and ``extra`` members."""
    hints = get_type_hints(PlanRecord)
    by_name = {f.name: f for f in fields(PlanRecord)}

    def member(n: str) -> tuple[Any, Any]:
        f = by_name[n]
        return hints[n], Field(... if f.default is MISSING else f.default, description=f.metadata.get("doc"))

    members = {n: member(n) for n in names}
    return create_model(name, __doc__=doc, **members, **extra)  # type: ignore[call-overload, no-any-return]


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
    scheme_reason: str | None = Field(None, description="why the scheme is not the profile's (absent when it is)")
    domain_size: int | None = None
    micro_batches: list[dict[str, Any]] | None = None
    communicators: list[list[int]] | None = None
    solver: dict[str, Any] | None = None
    static_baseline: dict[str, Any] | None = None
    static_baseline_reason: str | None = Field(
        None, description="why there is no static_baseline: the rule that ruled out every static layout"
    )
    model: str | None = Field(None, description="the name of the model the plan was made for")
    model_note: str | None = Field(
        None, description="present when the request named no model: the default model used, and how to name one"
    )
    error: dict[str, Any] | None = None


PlanSummary = record_model(
    "PlanSummary", SUMMARY_FIELDS, "One stored plan in the plan list: the record's fields without its documents."
)


def plan_summary(record: PlanRecord) -> Any:
    """The plan list's entry of a stored record."""
    return PlanSummary(**{name: getattr(record, name) for name in SUMMARY_FIELDS})


class PlanList(BaseModel):
    items: list[PlanSummary]  # type: ignore[valid-type]  # a model derived from PlanRecord
    total: int
    limit: int
    offset: int
    next_offset: int | None = Field(None, description="offset of the next page, or null on the last page")


Finite = Annotated[float, Field(allow_inf_nan=False)]


class FeedbackIn(BaseModel):
    """What the trainer measured for a step run with this plan. Numbers must be JSON numbers (not strings), and
    finite."""

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
