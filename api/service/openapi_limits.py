"""The deployment's own limits written into the OpenAPI document it serves.

The request models carry the limits that hold everywhere; a deployment sets tighter ones (``DHP_MAX_SAMPLES``,
``DHP_MAX_BUDGET_MS``, its CPU count for job workers). Written into the schema, a client (or a generator of test
requests) knows them before it is refused with 422.
"""

from __future__ import annotations

import os
from typing import Any

from api.service.settings import Settings


def _tighten(node: dict[str, Any], key: str, value: float) -> None:
    """Lower ``maximum`` (or another bound) of a property, also inside an ``anyOf`` of it and null."""
    for option in node.get("anyOf", [node]):
        if option.get("type") in ("number", "integer", "array"):
            option[key] = min(option.get(key, value), value)


def with_deployment_limits(schema: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """``schema`` (the app's OpenAPI document) with this deployment's limits, changed in place and returned."""
    models = schema.get("components", {}).get("schemas", {})
    budget = models.get("OptionsIn", {}).get("properties", {}).get("time_budget_ms")
    if budget is not None:
        _tighten(budget, "maximum", settings.max_budget_ms)
    samples = models.get("PlanRequest", {}).get("properties", {}).get("batch", {}).get("properties", {}).get("samples")
    if samples is not None:
        samples["minItems"] = 1
        _tighten(samples, "maxItems", settings.max_samples)
    workers = models.get("JobRequest", {}).get("properties", {}).get("workers")
    if workers is not None:
        _tighten(workers, "maximum", os.cpu_count() or 1)
    return schema
