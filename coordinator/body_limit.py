"""The request-body limit (``KEYRANGE_MAX_BODY_BYTES``), refused before a body is buffered
whether or not Content-Length is set: one rule for the middleware guarding every route and
for the commit fast path, which reads its body itself."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator.errors import PayloadTooLarge
from coordinator.problems import error_response


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"request body exceeds {limit} bytes")


def declares_too_much(content_length: bytes | None, limit: int) -> bool:
    """Whether a Content-Length header value already says the body is over ``limit``."""
    return content_length is not None and content_length.isdigit() and int(content_length) > limit


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


class BodySizeLimit:
    """ASGI middleware applying the limit to every request."""

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
        await self.app(scope, limited(receive, self.limit), send)
