"""Client routes of the offset store (docs/api.md)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import TypeAdapter, ValidationError
from sqlalchemy.ext.asyncio import AsyncConnection

from coordinator.auth import require_group_access
from coordinator.db.engine import transaction
from coordinator.errors import InvalidRequest
from coordinator.offsets import repository, service
from coordinator.offsets.batching import CommitBatcher
from coordinator.offsets.schemas import CommitReply, CommitRequest, OffsetsReply
from coordinator.validation import GroupId, PartitionQuery, TopicName

router = APIRouter(prefix="/v1/groups", tags=["offsets"])

GroupPath = Annotated[GroupId, Path(description="Consumer group id")]

_GROUP_ID = TypeAdapter(GroupId)


class CommitRoute(APIRoute):
    """The commit route without FastAPI's generic request machinery.

    Commits are the hottest request by far, and resolving dependencies, validating a parsed
    body and re-validating the returned model cost more CPU than applying a batched commit.
    This route does the same steps directly (path and body validated with the same types,
    errors raised as the same ``RequestValidationError``), then calls the declared endpoint,
    whose signature still defines the OpenAPI description.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        endpoint = self.endpoint

        async def handle(request: Request) -> Response:
            try:
                group_id = _GROUP_ID.validate_python(request.path_params["group_id"])
            except ValidationError as exc:
                raise RequestValidationError(_located(exc, ("path", "group_id"))) from None
            if not _is_json(request.headers.get("content-type")):
                raise RequestValidationError(
                    [
                        {
                            "type": "content_type",
                            "loc": ("body",),
                            "msg": "the body must be JSON sent as application/json",
                        }
                    ]
                )
            try:
                body = CommitRequest.model_validate_json(await request.body())
            except ValidationError as exc:
                raise RequestValidationError(_located(exc, ("body",))) from None
            reply: CommitReply = await endpoint(request=request, group_id=group_id, body=body)
            return Response(reply.model_dump_json(), media_type="application/json")

        return handle


def _is_json(content_type: str | None) -> bool:
    media_type = (content_type or "").partition(";")[0].strip().lower()
    return media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )


def _located(exc: ValidationError, prefix: tuple[str, ...]) -> list[dict[str, Any]]:
    return [
        {**error, "loc": (*prefix, *error["loc"])}
        for error in exc.errors(include_url=False, include_input=False)
    ]


async def commit_offsets(request: Request, group_id: GroupPath, body: CommitRequest) -> CommitReply:
    """Apply an individual or classic commit atomically; per-partition outcomes in the reply."""
    require_group_access(request, group_id)
    service.check_limits(body, request.app.state.settings)
    batcher: CommitBatcher = request.app.state.commits
    result = await batcher.submit(group_id, body)
    if result.rebalance_needed:
        # Flagged only once the commit's transaction is over: committers hold the group row
        # FOR SHARE, so updating it inside would deadlock two commits that both hit the cap.
        await request.app.state.on_max_ic_reached(group_id)
    return result.reply


router.add_api_route(
    "/{group_id}/offsets/commit",
    commit_offsets,
    methods=["POST"],
    response_model=CommitReply,
    route_class_override=CommitRoute,
)


@router.get("/{group_id}/offsets", response_model=OffsetsReply)
async def fetch_offsets(
    request: Request,
    group_id: GroupPath,
    connection: Annotated[AsyncConnection, Depends(transaction)],
    topic: Annotated[list[TopicName] | None, Query()] = None,
    partition: Annotated[list[PartitionQuery] | None, Query()] = None,
) -> OffsetsReply:
    """Committed state per partition; partitions never committed are absent."""
    require_group_access(request, group_id)
    if partition and (not topic or len(topic) != 1):
        raise InvalidRequest("filtering by 'partition' needs exactly one 'topic'")
    stored = await repository.read_partitions(connection, group_id, topic, partition)
    return OffsetsReply(group_id=group_id, partitions=service.offsets_reply(stored))
