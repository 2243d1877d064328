"""The tuning dashboard: its pages under /dashboard and the JSON endpoints they read under /v1/dashboard.

The pages are static files of the package (no data in them, no token needed to load them); every
figure comes from the JSON endpoints, which need the same bearer token as the rest of /v1.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path as FsPath
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import HTMLResponse

from api.dashboard.calibration import calibration
from api.dashboard.plan_view import plan_view
from api.dashboard.tuning import replan
from api.dashboard.view_schemas import Calibration, Changes, Facets, PlanTable, PlanView, ReplanIn, ReplanOut
from api.service.deps import ServiceDep, SettingsDep, StoreDep, require_token
from api.service.routes.plans import _ERRORS, NOT_FOUND, PlanFilterDep, PlanId, _not_found, text_query
from api.service.routes.profiles import DEFAULT_LATEST, MAX_STEPS, ProfileFitIn, fit_selection
from api.store import queries
from api.store.profile_names import profile_name

PAGES = FsPath(__file__).resolve().parent / "static"
Sort = Literal[queries.SORT_KEYS]  # type: ignore[valid-type]  # the store's sort keys, as one type

router = APIRouter(prefix="/v1/dashboard", tags=["dashboard"], dependencies=[Depends(require_token)], responses=_ERRORS)
pages = APIRouter(prefix="/dashboard", include_in_schema=False)


@router.get("/plans", response_model=PlanTable, summary="The plans table: sorted, filtered and paginated server-side")
def plan_table(
    store: StoreDep,
    given: PlanFilterDep,
    id_prefix: Annotated[
        str | None, Query(max_length=32, pattern="^[0-9a-fA-F]*$", description="plans whose id starts with this")
    ] = None,
    sort: Annotated[Sort, Query(description="column to sort on; rows without a value come last")] = "created_at",
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
) -> PlanTable:
    filters = queries.PlanFilters(**asdict(given), id_prefix=id_prefix or None)
    rows, total = queries.plan_table(store, filters, sort=sort, descending=order == "desc", limit=limit, offset=offset)
    for row in rows:
        row["profile_name"] = profile_name(row["profile"])
    nxt = offset + len(rows) if offset + len(rows) < total else None
    return PlanTable.model_validate(
        {
            "items": rows,
            "total": total,
            "limit": limit,
            "offset": offset,
            "sort": sort,
            "order": order,
            "next_offset": nxt,
        }
    )


@router.get("/facets", response_model=Facets, summary="The values the plans table's filters can take")
def facets(store: StoreDep) -> Facets:
    labels = queries.profile_labels(store)
    return Facets(**queries.facets(store), profile=labels, profile_names={k: profile_name(k) for k in labels})


@router.get("/changes", response_model=Changes, summary="A cheap stamp of the store's contents, for live refresh")
def changes(store: StoreDep) -> Changes:
    return Changes.model_validate(queries.change_stamp(store))


@router.get(
    "/plans/{plan_id}",
    response_model=PlanView,
    summary="One plan laid out for the dashboard: Gantt blocks, solver trace, feedback",
    responses=NOT_FOUND,
)
def one_plan(plan_id: PlanId, store: StoreDep) -> PlanView:
    record = store.get(plan_id)
    if record is None:
        raise _not_found(plan_id)
    return PlanView.model_validate(plan_view(record, store.feedback_for(plan_id)))


@router.post(
    "/plans/{plan_id}/replan",
    response_model=ReplanOut,
    summary="Plan a stored request again with other options (not stored)",
    responses=NOT_FOUND,
)
async def replan_plan(
    plan_id: PlanId, body: ReplanIn, store: StoreDep, service: ServiceDep, settings: SettingsDep
) -> ReplanOut:
    """The stored request with ``options`` laid over its own, for a plan of any status (pending and failed
    ones too). The budget is ``options.time_budget_ms``, else 200 ms (``REPLAN_BUDGET_MS``, at most the
    server's limit), never the stored request's; it counts from the start of the solve.
    Runs on the service's solve threads (503 with Retry-After when they are full)."""
    record = await asyncio.to_thread(store.get, plan_id)
    if record is None:
        raise _not_found(plan_id)
    result = await service.pool.run(replan, record, body.options.model_dump(exclude_none=True), settings)
    return ReplanOut.model_validate(result)


@router.get(
    "/calibration",
    response_model=Calibration,
    summary="Predicted against measured step times from feedback, by profile and cluster",
)
def calibration_view(
    store: StoreDep,
    cluster: Annotated[str | None, text_query(128)] = None,
    model: Annotated[str | None, text_query(128)] = None,
    profile: Annotated[str | None, text_query(2000, "'analytical' or a profile's source")] = None,
    limit: Annotated[int, Query(ge=1, le=20_000, description="newest points returned for the scatter")] = 2000,
) -> Calibration:
    rows, total = queries.calibration_points(store, cluster=cluster, model=model, profile=profile)
    return Calibration.model_validate(calibration(rows, total, limit))


@router.get(
    "/calibration/suggestion",
    summary="The profile a refit over the selected steps' group times would give (nothing stored)",
)
def calibration_suggestion(
    store: StoreDep,
    cluster: Annotated[str, text_query(128)],
    model: Annotated[str, text_query(128)],
    profile: Annotated[str | None, text_query(200, "'analytical' or a profile's source")] = None,
    latest: Annotated[int, Query(ge=1, le=MAX_STEPS, description="newest measured steps to fit")] = DEFAULT_LATEST,
) -> dict[str, Any]:
    """What ``POST /v1/profiles/fit`` with the same selection would store: the suggested profile, its terms beside
    the current profile's, the held-out errors before and after, and per measured group its time and the
    predictions of both (for the scatter). A refused fit answers 422 with the reason."""
    selection = ProfileFitIn.model_validate({"cluster": cluster, "model": model, "profile": profile, "latest": latest})
    steps, result = fit_selection(store, selection)
    return {
        "cluster": cluster,
        "model": model,
        "profile": steps[0].profile,
        "profile_name": profile_name(steps[0].profile),
        "steps": len(steps),
        "suggested": result.profile.to_json(),
        "fit": result.to_json(predictions=True),
    }


NAVIGATION = (("Plans", "/dashboard"), ("Calibration", "/dashboard/calibration"), ("API docs", "/docs"))
"""The links of every page's navigation bar, in order (label, address)."""

FRAME = "page.html"
"""The frame every page shares (head, header with the navigation bar and the token form, the error line);
a page file holds a first line ``<!-- title: TITLE -->`` and the content of its ``<main>``, and its script
is the ``.js`` file of the same name."""


@lru_cache(maxsize=16)
def _html(name: str, current: str | None) -> str:
    """Page ``name`` in the frame, its navigation link ``current`` marked as this page."""
    links = "\n".join(
        f'    <a href="{href}"' + (' aria-current="page"' if href == current else "") + f">{label}</a>"
        for label, href in NAVIGATION
    )
    first, _, content = (PAGES / name).read_text(encoding="utf-8").partition("\n")
    title = first.removeprefix("<!-- title: ").removesuffix(" -->")
    marks = {
        "<!-- page: title -->": title,
        "<!-- page: script -->": FsPath(name).with_suffix(".js").name,
        "<!-- page: navigation -->": f'<nav aria-label="Dashboard">\n{links}\n  </nav>',
        "<!-- page: content -->\n": content,
    }
    text = (PAGES / FRAME).read_text(encoding="utf-8")
    for mark, value in marks.items():
        text = text.replace(mark, value)
    return text


def _page(name: str, current: str | None = None) -> HTMLResponse:
    return HTMLResponse(_html(name, current), headers={"Cache-Control": "no-cache"})


@pages.get("")
@pages.get("/")
def plans_page() -> HTMLResponse:
    return _page("plans.html", current="/dashboard")


@pages.get("/plans/{plan_id}")
def plan_page(plan_id: PlanId) -> HTMLResponse:
    return _page("plan.html")


@pages.get("/plans/{plan_id}/tuning")
def tuning_page(plan_id: PlanId) -> HTMLResponse:
    return _page("tuning.html")


@pages.get("/calibration")
def calibration_page() -> HTMLResponse:
    return _page("calibration.html", current="/dashboard/calibration")
