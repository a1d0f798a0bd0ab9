"""A SERVER span around a route served ahead of FastAPI (the heartbeat's fast path), which the
FastAPI instrumentation does not see (docs/operations.md, "Tracing")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.types import Message, Scope, Send


async def traced_route(
    tracer: Any, scope: Scope, route: str, serve: Callable[[Send], Awaitable[None]], send: Send
) -> None:
    """``serve(send)`` inside a span named after ``route``, the child of the request's
    ``traceparent``, with the status it answered."""
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind, Status, StatusCode

    carrier = {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in scope["headers"]
        if name in (b"traceparent", b"tracestate")
    }
    method = scope["method"]
    span = tracer.start_span(
        f"{method} {route}",
        context=propagate.extract(carrier),
        kind=SpanKind.SERVER,
        attributes={"http.request.method": method, "http.route": route, "url.path": scope["path"]},
    )

    async def answering(message: Message) -> None:
        if message["type"] == "http.response.start":
            status = message["status"]
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR))
        await send(message)

    try:
        await serve(answering)
    finally:
        span.end()
