"""OpenTelemetry traces through records (docs/operations.md, "Tracing"), with the optional extra
``keyrange[otel]``.

Each runtime (``run()``, the worker, streams) opens one span per record it hands to user
code, from the hand-out to the record's outcome: its kind is CONSUMER, its name
``process <topic>``, its attributes OpenTelemetry's messaging conventions plus Keyrange's own
(key hash, member, attempts). The span is the **child** of the trace context in the record's
W3C ``traceparent`` header, not a link: one record is processed at a time, so the producer's
trace carries on through the handler and into what the handler produces (OpenTelemetry's
conventions allow either for single-message processing; a parent keeps the trace one tree that
any tracing UI shows end to end). User code runs with the span current, so its own spans and
an instrumented producer's nest under it; records a streams sink produces carry its context in
their ``traceparent`` header.

Configuration is OpenTelemetry's own: the standard ``OTEL_*`` variables read by the SDK the
application sets up (``opentelemetry-instrument``, or a ``TracerProvider`` it installs). With
the extra not installed, no SDK set up, or ``OTEL_SDK_DISABLED=true``, ``record_tracer`` gives
None when a runtime starts, and each record costs one ``is None`` branch.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context
    from opentelemetry.trace import ProxyTracerProvider, SpanKind, Status, StatusCode
except ImportError:
    trace = None  # type: ignore[assignment]

TRACEPARENT = "traceparent"
Result = TypeVar("Result")


def record_tracer(
    runtime: str, group_id: str, member: Callable[[], str | None]
) -> RecordTracer | None:
    """The tracer a runtime uses for its records, or None when tracing is off: the extra is
    not installed, the SDK is disabled, or no tracer provider was set up before the runtime
    started (the API's default provider records nothing)."""
    if not tracing_enabled():
        return None
    return RecordTracer(runtime, group_id, member, trace.get_tracer_provider())


def tracing_enabled() -> bool:
    """The extra is installed, the SDK not disabled, and a tracer provider is set up."""
    if trace is None or os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return not isinstance(trace.get_tracer_provider(), ProxyTracerProvider)


class RecordTracer:
    def __init__(
        self, runtime: str, group_id: str, member: Callable[[], str | None], provider: Any
    ) -> None:
        self._tracer = provider.get_tracer("keyrange")
        self._member = member
        # What every span of this runtime carries, built once.
        self._common = {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.consumer.group.name": group_id,
            "keyrange.runtime": runtime,
        }

    def start(self, topic: str, partition: int, record: Any, key_hash: int) -> RecordSpan:
        """The span of ``record``, from now until ``RecordSpan.end``."""
        carrier = _carrier(record.headers)
        # A record without a trace context starts a trace of its own, whatever is current
        # where the runtime happens to run.
        parent = propagate.extract(carrier, context=Context()) if carrier else Context()
        attributes = {
            **self._common,
            "messaging.destination.name": topic,
            "messaging.destination.partition.id": str(partition),
            "messaging.kafka.offset": record.offset,
            "keyrange.key_hash": key_hash,
        }
        member = self._member()
        if member is not None:
            attributes["keyrange.member_id"] = member
        span = self._tracer.start_span(
            f"process {topic}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
        )
        return RecordSpan(span)


class RecordSpan:
    """One record's span: attempts and their failures as events, the outcome as its status."""

    __slots__ = ("_context", "_ended", "_error", "span")

    def __init__(self, span: Any) -> None:
        self.span = span
        self._context = trace.set_span_in_context(span)
        self._error: BaseException | None = None
        self._ended = False

    def attempt(self, number: int) -> None:
        self.span.set_attribute("keyrange.attempt", number)

    def failed(self, error: BaseException, step: str, **attributes: Any) -> None:
        """A failed attempt and what the failure policy does next (``step``)."""
        self._error = error
        self.span.add_event(
            step,
            {
                "exception.type": type(error).__qualname__,
                "exception.message": str(error),
                **attributes,
            },
        )

    def event(self, name: str, **attributes: Any) -> None:
        self.span.add_event(name, attributes)

    def end(self, outcome: str) -> None:
        """``outcome``: processed, skipped, dead_lettered, given_back (its slice went, or the
        member stops; it is delivered again) or failed (it stopped the runtime)."""
        if self._ended:
            return
        self._ended = True
        self.span.set_attribute("keyrange.outcome", outcome)
        if outcome == "processed":
            self.span.set_status(Status(StatusCode.OK))
        elif outcome in ("skipped", "dead_lettered", "failed") and self._error is not None:
            self.span.set_status(
                Status(StatusCode.ERROR, f"{type(self._error).__name__}: {self._error}")
            )
        self.span.end()

    def current(self) -> object:
        """Make the span current in this thread or task until ``restore`` is given the token."""
        return otel_context.attach(self._context)

    @staticmethod
    def restore(token: object) -> None:
        otel_context.detach(token)  # type: ignore[arg-type]

    def around(self, function: Callable[..., Result]) -> Callable[..., Result]:
        """``function`` running with the span current, on whichever thread runs it (a pool
        thread does not inherit the loop's context)."""

        @functools.wraps(function)
        def run(*args: Any) -> Result:
            token = otel_context.attach(self._context)
            try:
                return function(*args)
            finally:
                otel_context.detach(token)

        return run

    def around_async(self, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        async def run(*args: Any) -> Any:
            token = otel_context.attach(self._context)
            try:
                return await function(*args)
            finally:
                otel_context.detach(token)

        return run

    def headers(self, headers: Sequence[tuple[str, bytes]]) -> tuple[tuple[str, bytes], ...]:
        """``headers`` with the trace context of this span instead of the one they had, for a
        record produced while processing this one."""
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=self._context)
        kept = [(key, value) for key, value in headers if key not in carrier]
        return (*kept, *((key, value.encode()) for key, value in carrier.items()))


def _carrier(headers: Sequence[tuple[str, bytes]] | None) -> Mapping[str, str]:
    found: dict[str, str] = {}
    for key, value in headers or ():
        if key in (TRACEPARENT, "tracestate", "baggage") and value is not None:
            found[key] = value.decode("latin-1")
    return found


def trace_headers() -> list[tuple[str, bytes]]:
    """The current trace context as Kafka headers, for user code producing a record from a
    handler: pass them as the record's ``headers`` and the trace goes on into it (an
    instrumented producer does this by itself). Empty when tracing is off."""
    if trace is None:
        return []
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [(key, value.encode()) for key, value in carrier.items()]


def configure_from_environment() -> str | None:
    """Set up the OpenTelemetry SDK from the standard variables, for Keyrange's own commands
    (``keyrange serve``, ``keyrange worker``, ``keyrange streams``): only when an exporter is
    asked for (``OTEL_TRACES_EXPORTER``, or an OTLP endpoint), the SDK is installed and not
    disabled, and nothing set up a tracer provider before (``opentelemetry-instrument`` does).
    The SDK itself reads the rest (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
    ``OTEL_TRACES_SAMPLER``, ``OTEL_EXPORTER_OTLP_*``, ``OTEL_BSP_*``). Returns the exporter
    set up, or None."""
    environ = os.environ
    wanted = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not wanted and (
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        wanted = "otlp"
    if trace is None or wanted in ("", "none"):
        return None
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if not isinstance(trace.get_tracer_provider(), ProxyTracerProvider):
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        raise TracingUnavailable(
            "OTEL_TRACES_EXPORTER is set but the OpenTelemetry SDK is not installed: "
            "pip install 'keyrange[otel]'"
        ) from None
    exporter: SpanExporter
    if wanted == "console":
        exporter = ConsoleSpanExporter()
    elif wanted == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise TracingUnavailable(
                "the OTLP exporter is not installed: pip install 'keyrange[otel]'"
            ) from None
        exporter = OTLPSpanExporter()
    else:
        raise TracingUnavailable(
            f"OTEL_TRACES_EXPORTER={wanted!r}: Keyrange's commands set up 'otlp' (over HTTP) "
            "or 'console'; for another exporter run the command under opentelemetry-instrument"
        )
    provider = TracerProvider(resource=Resource.create())
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return wanted


class TracingUnavailable(Exception):
    """Tracing was asked for and cannot be set up; the message says what to install."""
