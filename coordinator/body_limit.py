"""The request-body limit (``KEYRANGE_MAX_BODY_BYTES``), refused with 413 before more than the
limit is buffered, whether the body declares its length or comes in chunks: one rule for the
middleware guarding every route and for the commit fast path, which reads its body itself."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator.errors import PayloadTooLarge
from coordinator.problems import error_response


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body exceeds {limit} bytes")


def declares_too_much(content_length: bytes | None, limit: int) -> bool:
    """Whether a Content-Length header value already says the body is over ``limit``."""
    return content_length is not None and content_length.isdigit() and int(content_length) > limit


class ClientGone(Exception):
    """The client disconnected before its whole body arrived: nobody to answer."""


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body; ``PayloadTooLarge`` as soon as it exceeds ``limit``."""
    chunks: list[bytes] = []
    received = limited(receive, limit)
    while True:
        message = await received()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def limited(receive: Receive, limit: int) -> Receive:
    """``receive`` raising ``PayloadTooLarge`` once the body received exceeds ``limit``."""
    received = 0

    async def limited_receive() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise too_large(limit)
        return message

    return limited_receive


def replaying(body: bytes, receive: Receive) -> Receive:
    """``receive`` that gives ``body`` first, in one message, then what ``receive`` gives
    (a disconnect, once the client goes)."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class BodySizeLimit:
    """ASGI middleware applying the limit to every request before the application sees it.

    The body is read here, whole, and handed on: a handler that meets the limit halfway
    through reading would answer as it answers any failed read (FastAPI: 400), and a route
    that never reads its body would not meet it at all. Every route reads its whole JSON
    body anyway, so reading it first costs no memory the route would not have used.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope.get("headers", []) if k == b"content-length"), None)
        if declares_too_much(declared, self.limit):
            await error_response(too_large(self.limit))(scope, receive, send)
            return
        try:
            body = await read_body(receive, self.limit)
        except PayloadTooLarge as exc:
            await error_response(exc)(scope, receive, send)
            return
        except ClientGone:
            return
        await self.app(scope, replaying(body, receive), send)
