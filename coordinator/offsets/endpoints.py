"""Client routes of the offset store (docs/api.md)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.routing import APIRoute
from starlette.types import Receive, Scope, Send

from coordinator.db.engine import Transaction
from coordinator.errors import InvalidRequest
from coordinator.offsets import fast_path, repository, service
from coordinator.offsets.schemas import CommitReply, CommitRequest, OffsetsReply
from coordinator.problems import TOKEN_ROUTE_ERRORS, problem_responses
from coordinator.validation import GroupId, PartitionQuery, TopicName

router = APIRouter(
    prefix="/v1/groups", tags=["offsets"], responses=problem_responses(*TOKEN_ROUTE_ERRORS)
)

GroupPath = Annotated[GroupId, Path(description="Consumer group id")]


class CommitRoute(APIRoute):
    """The commit route, served by ``fast_path.serve_commit`` as the fast-path middleware
    serves it: this is the way in for the requests the middleware leaves to the router
    (those under a root path), so both answer alike; ``RouteMetrics`` counts these."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        async def handle(request: Request) -> Response:
            return _ServedCommit(request.path_params["group_id"])

        return handle


class _ServedCommit(Response):
    """A response that is the whole commit exchange: it reads the body itself."""

    def __init__(self, group_id: str) -> None:
        super().__init__()
        self.group_id = group_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await fast_path.serve_commit(scope, receive, send, self.group_id)


async def commit_offsets(group_id: GroupPath, body: CommitRequest) -> CommitReply:
    """Apply an individual or classic commit atomically; per-partition outcomes in the reply."""
    # The signature declares the route in OpenAPI; CommitRoute serves it.
    raise NotImplementedError


router.add_api_route(
    fast_path.ROUTE.removeprefix(router.prefix),
    commit_offsets,
    methods=["POST"],
    response_model=CommitReply,
    responses=problem_responses(400, 409, 503),
    route_class_override=CommitRoute,
)


@router.get(
    "/{group_id}/offsets", response_model=OffsetsReply, responses=problem_responses(400, 503)
)
async def fetch_offsets(
    group_id: GroupPath,
    connection: Transaction,
    topic: Annotated[list[TopicName] | None, Query()] = None,
    partition: Annotated[list[PartitionQuery] | None, Query()] = None,
) -> OffsetsReply:
    """Committed state per partition; partitions never committed are absent."""
    if partition and (not topic or len(topic) != 1):
        raise InvalidRequest("filtering by 'partition' needs exactly one 'topic'")
    stored = await repository.read_partitions(connection, group_id, topic, partition)
    return OffsetsReply(group_id=group_id, partitions=service.offsets_reply(stored))
