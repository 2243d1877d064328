"""/v1/presets: the preset clusters, models and GPU types by name, with their documents."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from api.service.deps import require_token
from api.service.routes.plans import problem_responses
from optimizer.costs.zoo import describe_presets

router = APIRouter(
    prefix="/v1",
    tags=["presets"],
    dependencies=[Depends(require_token)],
    responses=problem_responses((401, "missing or wrong bearer token")),
)


@router.get("/presets", summary="Preset clusters, models and GPU types")
def presets() -> dict[str, Any]:
    return describe_presets()
