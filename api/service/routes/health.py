"""Health, readiness and metrics; open without a token (for load balancers and Prometheus)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response

from api.service.deps import ServiceDep, StoreDep
from api.service.problem_details import ServiceError
from api.service.schemas import Health, ProblemDetail, Ready

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="The process is up")
def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Ready,
    summary="The store answers and solves can be admitted",
    responses={
        503: {
            "model": ProblemDetail,
            "content": {"application/problem+json": {}},
            "description": "the store does not answer",
        }
    },
)
async def readyz(store: StoreDep, service: ServiceDep) -> Ready:
    if not await asyncio.to_thread(store.ping):
        raise ServiceError(
            503,
            "Not ready",
            "the plan store does not answer",
            kind="not-ready",
            hint="check DHP_DATABASE_URL / DATABASE_URL and that the database server is up.",
            headers={"Retry-After": "5"},
        )
    pool = service.pool
    return Ready(
        status="ready",
        database="ok",
        solves_in_flight=pool.in_flight,
        queue_depth=pool.queue_depth,
        capacity=pool.capacity,
    )


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}},
)
def metrics(service: ServiceDep) -> Response:
    body, content_type = service.metrics.exposition()
    return Response(body, media_type=content_type)
