"""``GET /v1/limits``: the per-request limits a client must keep to, so the SDK sizes its
commits by what this coordinator accepts instead of a number compiled into it."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from coordinator.problems import problem_responses
from coordinator.settings import Settings

router = APIRouter(prefix="/v1", tags=["limits"])


class LimitsReply(BaseModel):
    max_ranges_per_request: int
    max_partitions_per_request: int
    max_metadata_chars: int
    max_body_bytes: int


@router.get("/limits", response_model=LimitsReply, responses=problem_responses(401, 413))
async def limits(request: Request) -> LimitsReply:
    """What one commit may carry; any valid token may read it."""
    settings: Settings = request.app.state.settings
    return LimitsReply(
        max_ranges_per_request=settings.max_ranges_per_request,
        max_partitions_per_request=settings.max_partitions_per_request,
        max_metadata_chars=settings.max_metadata_chars,
        max_body_bytes=settings.max_body_bytes,
    )
