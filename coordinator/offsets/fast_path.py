"""The commit route as a bare ASGI handler, ahead of FastAPI's request machinery.

Commits are the coordinator's hottest request by far. Through FastAPI, routing, the exception
and exit-stack middlewares and the ``Request`` object cost more CPU than the HTTP server and
the validation of the body together, and FastAPI's own entry point reads the environment on
every request to decide whether it traces it. The application (``CoordinatorApp`` in
``coordinator/app.py``) hands ``POST /v1/groups/{group_id}/offsets/commit`` to
``serve_fast_path`` before FastAPI sees it; the handler takes the same steps in the same order
as the declared route (body limit, path, content type, body, request limits, commit; the
token was checked before all of them, by ``coordinator.auth.admit``)
and gives the same answers, problem documents included, and records the route metrics
itself. The FastAPI route stays declared: it describes the endpoint in OpenAPI, and it answers
through ``serve_commit`` as well the commits the fast path leaves to the router (those under a
root path, whose matching is the router's business).

The commits most clients send do not even come this far: the HTTP protocol answers them itself
(``coordinator/offsets/direct.py``) with this module's checks and answers, and hands this
handler every request it does not take.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError
from starlette.types import Receive, Scope, Send

from coordinator import metrics
from coordinator.auth import Principal, admitted
from coordinator.body_limit import ClientGone, declares_too_much, read_body, too_large
from coordinator.offsets import service
from coordinator.offsets.commit_tracing import CommitTrace
from coordinator.offsets.schemas import CommitRequest
from coordinator.offsets.service import CommitResult
from coordinator.problems import error_response
from coordinator.settings import Settings
from coordinator.validation import GroupId

ROUTE = "/v1/groups/{group_id}/offsets/commit"
# What follows the group id: ``group_route(scope, SUFFIX)`` picks the requests served here.
SUFFIX = ROUTE.partition("{group_id}")[2]
_GROUP_ID = TypeAdapter(GroupId)
_JSON_HEADERS = [(b"content-type", b"application/json")]
# Above this size a body is validated in a worker thread: a 10,000-partition commit (about
# 1 MB) takes 50 ms and more, and its per-partition checks are Python code, so the event loop
# gets the interpreter back every switch interval and keeps serving other requests. Below it,
# the thread hand-off would cost more than it saves.
_VALIDATE_IN_THREAD_BYTES = 256 * 1024

Submission = tuple[CommitRequest, Principal]


async def serve_fast_path(scope: Scope, receive: Receive, send: Send, raw_group_id: str) -> None:
    """Answer a commit that ``group_route(scope, SUFFIX)`` picked, and record the route metrics."""
    started = time.perf_counter()
    tracer = scope["app"].state.route_tracer
    trace = None if tracer is None else CommitTrace(tracer, scope, raw_group_id)
    status = await serve_commit(scope, receive, send, raw_group_id, trace)
    if trace is not None:
        trace.end(status)
    if status is not None:
        record(status, started)


def record(status: int, started: float) -> None:
    """Count a commit answered with ``status``, and its latency since ``started``."""
    served = _SERVED if status == 200 else metrics.HTTP_REQUESTS.labels("POST", ROUTE, str(status))
    served.inc()
    _LATENCY.observe(time.perf_counter() - started)


_SERVED = metrics.HTTP_REQUESTS.labels("POST", ROUTE, "200")
_LATENCY = metrics.HTTP_LATENCY.labels("POST", ROUTE)


async def serve_commit(
    scope: Scope,
    receive: Receive,
    send: Send,
    raw_group_id: str,
    trace: CommitTrace | None = None,
) -> int | None:
    """Answer one commit request, errors included; its status, or None when the client left
    before sending its whole body."""
    try:
        group_id, reply = await _submit(scope, receive, raw_group_id, trace)
    except ClientGone:
        return None
    except Exception as exc:
        return await _answer_error(exc, scope, receive, send)
    return await serve_submitted(scope, receive, send, group_id, reply)


async def serve_submitted(
    scope: Scope,
    receive: Receive,
    send: Send,
    group_id: str,
    reply: Awaitable[CommitResult],
) -> int:
    """Answer a commit handed to the batcher once ``reply`` is decided; its status."""
    try:
        result = await reply
        if result.rebalance_needed:
            # Flagged only once the commit's transaction is over: committers hold the group
            # row FOR SHARE, so updating it inside would deadlock two commits that both hit
            # the cap.
            await scope["app"].state.on_max_ic_reached(group_id)
    except Exception as exc:
        return await _answer_error(exc, scope, receive, send)
    body = result.body()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
    return 200


async def _answer_error(exc: Exception, scope: Scope, receive: Receive, send: Send) -> int:
    response = error_response(exc)
    await response(scope, receive, send)
    return response.status_code


def checked_head(scope: Scope, settings: Settings, raw_group_id: str) -> str:
    """The group id of a commit whose headers and path pass, in the route's order of checks:
    the declared size, the path, the content type."""
    content_type = ""
    declared_length: bytes | None = None
    for name, value in scope["headers"]:
        if name == b"content-type":
            content_type = value.decode("latin-1")
        elif name == b"content-length":
            declared_length = value
    limit = settings.max_body_bytes
    if declares_too_much(declared_length, limit):
        raise too_large(limit)
    try:
        group_id: str = _GROUP_ID.validate_python(raw_group_id)
    except ValidationError as exc:
        raise RequestValidationError(_located(exc, ("path", "group_id"))) from None
    if not _is_json(content_type):
        raise RequestValidationError(
            [
                {
                    "type": "content_type",
                    "loc": ("body",),
                    "msg": "the body must be JSON sent as application/json",
                }
            ]
        )
    return group_id


def checked_body(scope: Scope, settings: Settings, request: CommitRequest | bytes) -> Submission:
    """A commit's body, validated here unless it already was, and its submission once the
    request passes the limits; raises what the route answers otherwise."""
    try:
        if isinstance(request, bytes):
            request = CommitRequest.model_validate_json(request)
    except ValidationError as exc:
        raise RequestValidationError(_located(exc, ("body",))) from None
    principal = admitted(scope)
    service.check_limits(request, settings)
    return request, principal


async def _submit(
    scope: Scope, receive: Receive, raw_group_id: str, trace: CommitTrace | None
) -> tuple[str, Awaitable[CommitResult]]:
    """The group id, and the batcher's reply to the request once it passed every check."""
    state = scope["app"].state
    settings: Settings = state.settings
    group_id = checked_head(scope, settings, raw_group_id)
    body = await read_body(receive, settings.max_body_bytes)
    parsed: CommitRequest | bytes = body
    if len(body) > _VALIDATE_IN_THREAD_BYTES:
        try:
            parsed = await asyncio.to_thread(CommitRequest.model_validate_json, body)
        except ValidationError as exc:
            raise RequestValidationError(_located(exc, ("body",))) from None
    request, principal = checked_body(scope, settings, parsed)
    if trace is not None:
        trace.admitted()
    reply = state.commits.enqueue(group_id, request, principal.group_scope(group_id), trace)
    return group_id, reply


def _is_json(content_type: str) -> bool:
    media_type = content_type.partition(";")[0].strip().lower()
    return media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )


def _located(exc: ValidationError, prefix: tuple[str, ...]) -> list[dict[str, Any]]:
    return [
        {**error, "loc": (*prefix, *error["loc"])}
        for error in exc.errors(include_url=False, include_input=False)
    ]
