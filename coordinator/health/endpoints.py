"""Probes and metrics. Unauthenticated by design: they reveal no group data unless the
operator opts in or the scraper presents a metrics token."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from coordinator import metrics
from coordinator.auth import may_read_group_metrics
from coordinator.errors import ServiceUnavailable
from coordinator.problems import problem_responses

router = APIRouter(tags=["operations"])


@router.get("/livez", responses=problem_responses(413))
async def livez() -> dict[str, str]:
    """The process serves requests; no I/O, so a slow database never restarts the pod."""
    return {"status": "ok"}


@router.get("/readyz", responses=problem_responses(413, 503))
async def readyz(request: Request) -> dict[str, str]:
    """Ready when the database answers; a replica without it should get no traffic."""
    try:
        async with request.app.state.engine.connect() as connection:
            await connection.execute(text("SELECT 1"))
    except Exception as exc:
        raise ServiceUnavailable(f"database not reachable ({type(exc).__name__})") from None
    return {"status": "ready"}


@router.get("/metrics", response_class=PlainTextResponse, responses=problem_responses(401, 413))
async def prometheus_metrics(request: Request) -> Response:
    exposition = generate_latest()
    authorizations = request.headers.getlist("authorization")
    if may_read_group_metrics(request.app.state.settings, authorizations):
        exposition += generate_latest(metrics.TENANT_REGISTRY)
    return Response(exposition, media_type=CONTENT_TYPE_LATEST)
