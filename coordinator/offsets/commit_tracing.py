"""Spans of a commit request when tracing is on (docs/operations.md, "Tracing"): the commit
route is served ahead of FastAPI (``coordinator.offsets.fast_path``), so it is traced here
rather than by the FastAPI instrumentation. One SERVER span per request, with three children
that say where a slow commit's time went: ``commit admission`` (reading and validating the
body, the request limits), ``commit queue`` (waiting in the group-commit batcher for a
transaction) and ``commit transaction`` (the batch's transaction, shared with the other
requests of its batch, whose size it carries)."""

from __future__ import annotations

import time
from typing import Any

from starlette.types import Scope

from client.tracing import tracing_enabled

ROUTE = "/v1/groups/{group_id}/offsets/commit"


def route_tracer() -> Any | None:
    """The tracer for the routes served ahead of FastAPI, or None when tracing is off
    (checked at start)."""
    if not tracing_enabled():
        return None
    from opentelemetry import trace

    return trace.get_tracer("keyrange.coordinator")


class CommitTrace:
    """One commit request's spans, opened when it arrives."""

    __slots__ = ("_admitted_ns", "_context", "_span", "_tracer")

    def __init__(self, tracer: Any, scope: Scope, group_id: str) -> None:
        from opentelemetry import propagate, trace
        from opentelemetry.trace import SpanKind

        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope["headers"]
            if name in (b"traceparent", b"tracestate")
        }
        self._tracer = tracer
        self._span = tracer.start_span(
            f"POST {ROUTE}",
            context=propagate.extract(carrier),
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": "POST",
                "http.route": ROUTE,
                "url.path": scope["path"],
                "keyrange.group_id": group_id,
            },
        )
        self._context = trace.set_span_in_context(self._span)
        self._admitted_ns = 0

    def admitted(self) -> None:
        """The body is read and valid, within the limits: it goes to the batcher now."""
        self._admitted_ns = time.time_ns()
        self._child("commit admission", self._span.start_time, self._admitted_ns)

    def applied(self, started_ns: int, ended_ns: int, batch_requests: int) -> None:
        """Its batch's transaction ran from ``started_ns`` to ``ended_ns``."""
        self._child("commit queue", self._admitted_ns, started_ns)
        self._child(
            "commit transaction",
            started_ns,
            ended_ns,
            {"keyrange.commit.batch_requests": batch_requests},
        )

    def end(self, status: int | None) -> None:
        if status is not None:
            self._span.set_attribute("http.response.status_code", status)
        if status is None or status >= 500:
            from opentelemetry.trace import Status, StatusCode

            self._span.set_status(Status(StatusCode.ERROR))
        self._span.end()

    def _child(
        self, name: str, start_ns: int, end_ns: int, attributes: dict[str, Any] | None = None
    ) -> None:
        span = self._tracer.start_span(
            name, context=self._context, start_time=start_ns, attributes=attributes
        )
        span.end(end_time=end_ns)
