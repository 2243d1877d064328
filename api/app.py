"""The application factory: ``create_app(settings)`` wires the store, the planning service and the routes.

``uvicorn --factory api.app:create_app`` (what ``dhp serve`` runs) builds one from the environment.
The store's schema is brought to the newest migration when the app is created.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from api.dashboard import endpoints as dashboard
from api.service import problem_details
from api.service.auto_refit import AutoRefit
from api.service.intake import BodyBudget
from api.service.metrics import Metrics, multiprocess_dir
from api.service.middleware import AdmissionPrecheck, ArrivalAndMetrics, BodyLimit, TokenGate
from api.service.openapi_limits import with_deployment_limits
from api.service.planning_service import PlanningService
from api.service.routes import health, jobs, plans, presets, profiles
from api.service.settings import Settings
from api.store import Store
from api.store.migrate import upgrade
from api.store.repository import utcnow
from optimizer.gc_pause import freeze_long_lived
from planning.planner import warm_up_service as warm_up

log = logging.getLogger("api")
ROUTERS = (
    plans.router,
    profiles.router,
    presets.router,
    health.router,
    dashboard.router,
    dashboard.pages,
    jobs.router,
)
"""Every router of the application, in the order they are mounted (the hostile-input bench reads them too)."""
STATIC = Path(__file__).resolve().parent / "static"
DESCRIPTION = """Plans of dynamic hybrid (data x context) parallelism for training batches.

POST /v1/plans takes the same documents as `dhp plan` input files and returns the verified plan
that `dhp plan` prints, with its id. Errors are RFC 9457 problem documents naming the field at
fault. When the server sets tokens, /v1 needs `Authorization: Bearer <token>`.
"""


def _resume(service: PlanningService, started_at: datetime) -> None:
    try:
        service.resume_pending(started_at)
    except Exception:  # the store is down at start-up: the next start resumes them
        log.exception("could not resume the pending plan-ahead requests")
    finally:
        service.resumed.set()


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()  # type: ignore[call-arg]  # read from the environment
    if not settings.database_url:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(settings.sqlalchemy_url)
    upgrade(store.engine)
    metrics = Metrics()
    service = PlanningService(settings, store, metrics)

    started_at = utcnow()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(warm_up)
        # Plan-ahead requests an earlier process accepted and never answered are solved now, beside new requests.
        threading.Thread(target=_resume, args=(service, started_at), name="dhp-resume", daemon=True).start()
        freeze_long_lived()  # what exists at start-up lives as long as the process (optimizer.gc_pause)
        yield
        service.pool.shutdown()
        store.close()
        if multiprocess_dir():
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(os.getpid())

    app = FastAPI(
        title="dhp-planner", version="0.1.0", description=DESCRIPTION, docs_url=None, redoc_url=None, lifespan=lifespan
    )
    app.state.settings = settings
    app.state.store = store
    app.state.service = service
    app.state.auto_refit = AutoRefit(store, settings.refit_every, settings.refit_error)
    problem_details.install(app)
    for router in ROUTERS:
        app.include_router(router)
    app.mount("/static/dashboard", StaticFiles(directory=dashboard.PAGES), name="dashboard-static")
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title="dhp-planner API",
            swagger_js_url="/static/swagger-ui-bundle.js",
            swagger_css_url="/static/swagger-ui.css",
            swagger_favicon_url="/static/favicon-32x32.png",
        )

    plain_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = with_deployment_limits(plain_openapi(), settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    # Outermost last: arrival and metrics, then the token (before any body is read), admission, the body limits.
    app.add_middleware(
        BodyLimit,
        max_bytes=settings.max_body_bytes,
        budget=BodyBudget(settings.max_body_bytes_in_flight),
        pool=service.pool,
        timeout_s=settings.body_timeout_s,
    )
    app.add_middleware(AdmissionPrecheck, pool=service.pool, max_budget_s=settings.max_budget_ms / 1000.0)
    guarded = settings.environment != "development" and not settings.token_list
    if guarded:
        log.warning(
            "%s without DHP_TOKENS: /v1 answers only connections that reach it on a loopback address",
            settings.environment,
        )
    app.add_middleware(TokenGate, tokens=settings.token_list, loopback_only=guarded)
    app.add_middleware(ArrivalAndMetrics, metrics=metrics)
    return app
