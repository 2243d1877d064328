"""Refitting the cost profile of stored plans from their measured group times.

The caller (the service's ``POST /v1/profiles/fit``, a benchmark) gives each measured step as its request
document, the plan document the planner returned, the group times and the step time; this reads each
request into its problem once (steps of the same request share it) and fits with
:func:`optimizer.costs.refit.fit_profile`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from optimizer.costs.refit import (
    DEFAULT_MAX_ERROR,
    DEFAULT_MIN_R2,
    MeasuredPlan,
    ProfileFit,
    fit_profile,
    measured_plan,
)
from optimizer.errors import ProblemError
from optimizer.problem.documents import problem_from_json
from optimizer.problem.problem import Problem


@dataclass(frozen=True)
class Step:
    """One measured step: ``key`` names it in the fit's report (e.g. ``plan_id#feedback_id``)."""

    key: str
    request: dict[str, Any]
    plan: dict[str, Any]
    group_times_s: Sequence[Sequence[float]]
    step_time_s: float | None


def measured_plans(steps: Sequence[Step]) -> list[MeasuredPlan]:
    """The steps as the fit reads them; a step whose plan no longer matches its request is refused by name."""
    problems: dict[str, Problem] = {}
    out = []
    for s in steps:
        digest = hashlib.sha256(repr(sorted(s.request.items())).encode()).hexdigest()
        problem = problems.get(digest)
        if problem is None:
            problem = problems[digest] = problem_from_json(s.request)
        try:
            out.append(measured_plan(s.key, problem, s.plan, s.group_times_s, s.step_time_s))
        except KeyError as exc:
            raise ProblemError(
                f"step {s.key}: the plan names sample {exc.args[0]!r}, which its request does not have",
                field="plan_ids",
                hint="fit plans stored by this service, with the feedback posted for them.",
            ) from None
    return out


def refit(
    steps: Sequence[Step],
    *,
    min_r2: float = DEFAULT_MIN_R2,
    max_error: float = DEFAULT_MAX_ERROR,
    source: str = "refitted from measured group times",
) -> ProfileFit:
    """The profile the steps' plans were made with, refitted to what they measured."""
    return fit_profile(measured_plans(steps), min_r2=min_r2, max_error=max_error, source=source)
