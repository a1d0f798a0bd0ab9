"""Probes and metrics. Unauthenticated by design: they reveal no group data."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

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


@router.get("/metrics", response_class=PlainTextResponse, responses=problem_responses(413))
async def prometheus_metrics() -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
