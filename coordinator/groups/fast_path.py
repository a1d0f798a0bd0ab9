"""The heartbeat route as a bare ASGI handler, ahead of FastAPI's request machinery.

With prompt hand-offs every stable member keeps a heartbeat open, renewed every interval:
10,000 members on one replica are 3,300 heartbeats a second, more than commits at their
busiest. Through FastAPI, routing, the middlewares, dependency solving and the ``Request``
object cost as much CPU as serving the heartbeat itself. ``CoordinatorApp`` (in
``coordinator/app.py``) hands ``POST /v1/groups/{group_id}/heartbeat`` to
``serve_fast_path`` before FastAPI sees it; it takes the declared route's steps in the same
order (body limit, content type, body, path and body validation; the token was checked before
all of them, by ``coordinator.auth.admit``), answers through the same ``serve.answer``, which
decides which path serves it, and records the route metrics itself. A request it cannot serve
as valid goes to FastAPI, so every refusal is the declared route's. The FastAPI route stays
declared: it describes the endpoint in OpenAPI, answers invalid requests and serves requests
under a root path.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

from pydantic import TypeAdapter
from starlette.types import ASGIApp, Receive, Scope, Send

from coordinator import metrics
from coordinator.body_limit import ClientGone, declares_too_much, read_body, replaying
from coordinator.errors import PayloadTooLarge
from coordinator.groups.schemas import HeartbeatReply, HeartbeatRequest
from coordinator.groups.serve import answer
from coordinator.problems import error_response
from coordinator.validation import GroupId

ROUTE = "/v1/groups/{group_id}/heartbeat"
# What follows the group id: ``group_route(scope, SUFFIX)`` picks the requests served here.
SUFFIX = ROUTE.partition("{group_id}")[2]
_GROUP_ID = TypeAdapter(GroupId)
_SERVED = metrics.HTTP_REQUESTS.labels("POST", ROUTE, "200")
# Put in a request's scope by the heartbeat's protocol path (``coordinator/groups/direct.py``)
# when its renewal found the member not stable, or the watch knew it would not be (an
# unsettled member): the request's ``(arrived, started)`` there. The locked path serves such
# a request at once, without a renewal's batch turn.
NOT_STABLE_SINCE = "keyrange.heartbeat.not_stable_since"
_LATENCY = metrics.HTTP_LATENCY.labels("POST", ROUTE)


async def serve_fast_path(
    scope: Scope, receive: Receive, send: Send, raw_group_id: str, routed: ASGIApp
) -> None:
    """Answer a heartbeat that ``group_route(scope, SUFFIX)`` picked; record the route metrics.

    Anything but a valid request is handed to ``routed`` (FastAPI, with the body read so
    far replayed), so a refusal is FastAPI's own, word for word: the fast path only ever
    serves requests both would serve alike."""
    handed_over: tuple[float, float] | None = scope.get(NOT_STABLE_SINCE)
    if handed_over is None:
        arrived, started = asyncio.get_running_loop().time(), time.perf_counter()
    else:
        arrived, started = handed_over
    state = scope["app"].state
    limit = state.settings.max_body_bytes
    content_type = b""
    declared_length: bytes | None = None
    for name, value in scope["headers"]:
        if name == b"content-type":
            content_type = value
        elif name == b"content-length":
            declared_length = value
    if declares_too_much(declared_length, limit) or not is_json(content_type):
        await routed(scope, receive, send)
        return
    try:
        body = await read_body(receive, limit)
    except ClientGone:
        return
    except PayloadTooLarge as exc:
        # As ``BodySizeLimit`` answers it, ahead of routing.
        await _answer_error(exc, scope, receive, send, "unmatched")
        return
    try:
        group_id, request = checked_request(raw_group_id, body)
    except ValueError:
        await routed(scope, replaying(body, receive), send)
        return
    reply = answer(state, scope, group_id, request, arrived, renew=handed_over is None)
    await serve_answer(scope, receive, send, reply, started)


def checked_request(raw_group_id: str, body: bytes) -> tuple[str, HeartbeatRequest]:
    """The group id and the request, validated as the declared route validates them; a
    ValueError for anything that route would refuse.

    The body is validated in pydantic's JSON mode, without ``json.loads`` first as FastAPI
    does: the model is strict, under which both modes decide alike (a fuzz of 30,000 mutated
    heartbeats found no request one accepts and the other refuses), and it costs half as much.
    Should they ever differ, a refused request still goes to FastAPI, which answers it."""
    group_id: str = _GROUP_ID.validate_python(raw_group_id)
    return group_id, HeartbeatRequest.model_validate_json(body)


async def serve_answer(
    scope: Scope,
    receive: Receive,
    send: Send,
    reply: Awaitable[HeartbeatReply | bytes],
    started: float,
) -> None:
    """Send ``reply`` once it is decided, or the problem document of what it raised, and
    record the route metrics (the latency from ``started`` includes a held reply's wait, as
    the declared route's always did)."""
    try:
        decided = await reply
    except Exception as exc:
        await _answer_error(exc, scope, receive, send, ROUTE)
        _LATENCY.observe(time.perf_counter() - started)
        return
    payload = decided if isinstance(decided, bytes) else decided.model_dump_json().encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
    record_served(started)


def record_served(started: float) -> None:
    """Count a heartbeat answered with a 200, and its latency since ``started``."""
    _SERVED.inc()
    _LATENCY.observe(time.perf_counter() - started)


async def _answer_error(
    exc: Exception, scope: Scope, receive: Receive, send: Send, template: str
) -> None:
    response = error_response(exc)
    await response(scope, receive, send)
    metrics.HTTP_REQUESTS.labels("POST", template, str(response.status_code)).inc()


def is_json(content_type: bytes) -> bool:
    """FastAPI's rule for parsing a body as JSON (``application/json`` or
    ``application/*+json``), for a request that names its content type."""
    media_type = content_type.partition(b";")[0].strip().lower()
    return media_type == b"application/json" or (
        media_type.startswith(b"application/") and media_type.endswith(b"+json")
    )
