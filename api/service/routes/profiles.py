"""/v1/profiles: cost profiles refitted from the group times trainers measured, and reading them back.

``POST /v1/profiles/fit`` fits the profile the named plans (or the latest measured steps of a cluster and
model) were made with to their measured group times (:mod:`planning.profile_refit`) and stores it as the next
version of its key; a plan request then names it as ``"profile": "learned:NAME"``.
"""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from api.service.deps import StoreDep, require_token
from api.service.problem_details import ServiceError
from api.service.routes.plans import TEXT_PATTERN, problem_responses, text_query
from api.store import Store
from api.store.learned_profiles import (
    NAME,
    PREFIX,
    VERSION,
    LearnedProfile,
    MeasuredStep,
    add_profile,
    get_profile,
    key_part,
    list_profiles,
    measured_steps,
    step_labels,
)
from api.store.profile_names import profile_name
from optimizer.costs.refit import DEFAULT_MAX_ERROR, DEFAULT_MIN_R2, ProfileFit
from planning.profile_refit import Step, refit

log = logging.getLogger("dhp.profiles")
DEFAULT_LATEST = 50
MAX_STEPS = 2000
KEY_LENGTH = 150

router = APIRouter(
    prefix="/v1",
    tags=["profiles"],
    dependencies=[Depends(require_token)],
    responses=problem_responses(
        (401, "missing or wrong bearer token"), (422, "invalid request, or a fit that is refused; names the field")
    ),
)


class ProfileFitIn(BaseModel):
    """Which measured steps to fit: ``plan_ids``, or the ``latest`` steps of a ``cluster`` and ``model`` (and
    ``profile`` label; the newest measured plan's when not given)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    plan_ids: list[Annotated[str, Field(max_length=32)]] | None = Field(
        None, min_length=1, max_length=MAX_STEPS, description="plans whose feedback carries group_times_s"
    )
    cluster: str | None = Field(None, max_length=128, pattern=TEXT_PATTERN, description="the plans' cluster name")
    model: str | None = Field(None, max_length=128, pattern=TEXT_PATTERN, description="the plans' model name")
    profile: str | None = Field(
        None, max_length=200, pattern=TEXT_PATTERN, description="the plans' profile label ('analytical', a source)"
    )
    latest: int | None = Field(None, ge=1, le=MAX_STEPS, description=f"newest steps to fit (default {DEFAULT_LATEST})")
    min_r2: float = Field(DEFAULT_MIN_R2, ge=-1.0, le=1.0, allow_inf_nan=False, description="refuse a fit below it")
    max_error: float = Field(
        DEFAULT_MAX_ERROR, gt=0.0, le=100.0, allow_inf_nan=False, description="refuse a fit missing a group by more"
    )


def _invalid(detail: str, field: str, hint: str) -> ServiceError:
    return ServiceError(422, "Invalid request", detail, kind="invalid-request", field=field, hint=hint)


def _steps(store: Store, body: ProfileFitIn) -> list[MeasuredStep]:
    if body.plan_ids is not None:
        if any(v is not None for v in (body.cluster, body.model, body.profile, body.latest)):
            raise _invalid(
                "give plan_ids or cluster and model, not both",
                "plan_ids",
                "drop plan_ids to fit the latest steps of a cluster and model, or drop the others.",
            )
        steps = measured_steps(store, plan_ids=body.plan_ids)
        if not steps:
            raise _invalid(
                "none of these plans has feedback with group_times_s",
                "plan_ids",
                "post feedback with group_times_s for each step (POST /v1/plans/{id}/feedback) and fit those plans.",
            )
        keys = {step_key(s) for s in steps}
        if len(keys) > 1:
            raise _invalid(
                f"these plans belong to {len(keys)} keys ({', '.join(sorted(keys)[:3])}): different clusters, models "
                "or profiles",
                "plan_ids",
                "fit the plans of one cluster, model and profile (or its refits) together "
                "(GET /v1/plans?cluster=&model= lists them).",
            )
        return steps
    if body.cluster is None or body.model is None:
        raise _invalid(
            "say which steps to fit",
            "plan_ids",
            'give "plan_ids", or "cluster" and "model" (with "latest", default 50) as the plans list them.',
        )
    label = body.profile
    newest = measured_steps(store, cluster=body.cluster, model=body.model, profile=label, latest=1)
    steps = []
    if newest:  # the newest step's key: its profile's and the refits' of it, on as many ranks
        key = step_key(newest[0])
        labels = [
            x
            for x in step_labels(store, body.cluster, body.model)
            if lineage_key(body.cluster, body.model, x, newest[0].n_ranks) == key
        ]
        steps = measured_steps(
            store,
            cluster=body.cluster,
            model=body.model,
            labels=labels,
            n_ranks=newest[0].n_ranks,
            latest=body.latest or DEFAULT_LATEST,
        )
    if not steps:
        raise _invalid(
            f"no feedback with group_times_s for plans of cluster {body.cluster!r} and model {body.model!r}"
            + (f" made with profile {label!r}" if body.profile else ""),
            "cluster",
            "use the cluster and model names GET /v1/plans lists, and post group_times_s with each step's feedback.",
        )
    return steps


def lineage_key(cluster: str | None, model: str | None, label: str, n_ranks: int) -> str:
    """The key of a refit: a learned profile's own key when the plans were made with one, else the cluster, model
    and profile's names (a cluster without a name of its own, ``custom``, with its GPU count)."""
    if label.startswith(PREFIX):
        name = label[len(PREFIX) :].split(" ", 1)[0]
        m = VERSION.match(name)
        if m and NAME.match(name):
            return m.group("key")
    where = f"custom-{n_ranks}gpu" if cluster in (None, "custom") else cluster
    return key_part(f"{where}.{model or 'model'}.{profile_name(label)}")[:KEY_LENGTH]


def step_key(step: MeasuredStep) -> str:
    return lineage_key(step.cluster, step.model, step.profile, step.n_ranks)


def held_out_error(fit: ProfileFit) -> float | None:
    """The fitted profile's mean error on held-out steps (micro-batches when the steps carry no step time)."""
    after = fit.held_out_after
    if after is None:
        return None
    return (after.steps or after.micro_batches)[0]


def _source(name: str, fit: ProfileFit) -> str:
    err = held_out_error(fit)
    held = f"; held-out error {err * 100:.1f}% mean" if err is not None else ""
    return f"{PREFIX}{name} (refit over {fit.points} group times of {fit.plans} steps{held})"


def fit_selection(store: Store, body: ProfileFitIn) -> tuple[list[MeasuredStep], ProfileFit]:
    """The measured steps a fit request selects and the fit over them (nothing stored)."""
    steps = _steps(store, body)
    result = refit(
        [
            Step(
                f"{s.plan_id}#{s.feedback_id}",
                json.loads(s.request_json),
                json.loads(s.plan_json),
                s.group_times_s,
                s.measured_step_time_s,
            )
            for s in steps
        ],
        min_r2=body.min_r2,
        max_error=body.max_error,
    )
    return steps, result


@router.post(
    "/profiles/fit",
    status_code=201,
    summary="Refit the plans' cost profile to their measured group times and store it",
)
def fit(body: ProfileFitIn, store: StoreDep) -> dict[str, Any]:
    """Answers 201 with the stored profile (``name``; a request names it ``"profile": "learned:NAME"``), its fit
    statistics and held-out errors before and after, and the plan and feedback ids it came from."""
    return store_fit(store, body).to_json()


def store_fit(store: Store, body: ProfileFitIn) -> LearnedProfile:
    """Fit the selected steps and store the profile as the next version of its key."""
    steps, result = fit_selection(store, body)
    first = steps[0]
    key = step_key(steps[-1])
    held = {p["plan"] for p in result.predictions if p["held_out"]}
    learned = add_profile(
        store,
        key,
        cluster=first.cluster,
        model=first.model,
        base_profile=steps[-1].profile,
        profile=lambda name: result.profile.to_json() | {"source": _source(name, result)},
        fit=result.to_json(),
        sources={
            "steps": [{"plan_id": s.plan_id, "feedback_id": s.feedback_id} for s in steps],
            "held_out": sorted(held),
        },
    )
    log.info(
        "refit %s from %d steps (%d group times): held-out step error %s",
        learned.name,
        result.plans,
        result.points,
        "n/a" if (err := held_out_error(result)) is None else f"{err:.3f}",
    )
    return learned


def _not_found(name: str) -> ServiceError:
    return ServiceError(
        404,
        "Not found",
        f"no learned profile named {name!r}",
        kind="not-found",
        field="name",
        hint="use a name POST /v1/profiles/fit returned (GET /v1/profiles lists them).",
    )


@router.get(
    "/profiles/{name}",
    summary="A learned profile with its fit and provenance (KEY.vN, or KEY for the newest)",
    responses=problem_responses((404, "no such learned profile")),
)
def get(name: Annotated[str, Path(max_length=200)], store: StoreDep) -> dict[str, Any]:
    name = name.removeprefix(PREFIX)
    learned = get_profile(store, name) if NAME.match(name) else None
    if learned is None:
        raise _not_found(name)
    return learned.to_json()


@router.get("/profiles", summary="Learned profiles, newest first")
def listing(
    store: StoreDep,
    key: Annotated[str | None, text_query(KEY_LENGTH, "only this key's versions")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[dict[str, Any]]:
    return [_summary(p) for p in list_profiles(store, key, limit)]


def _summary(p: LearnedProfile) -> dict[str, Any]:
    out = p.to_json()
    out["fit"] = {k: p.fit.get(k) for k in ("points", "plans", "r2", "held_out")}
    return out
