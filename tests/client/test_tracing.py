"""OpenTelemetry traces through records (client.tracing), with the SDK's in-memory exporter: a
record produced inside a span comes out as one trace across the producer, the runtime that
handled it and what the handler produced; the span's attributes and outcome are right in
``run()``, the worker (loop and thread calls, retries) and streams.

The tracer provider is process-wide and can be set once, so this module sets it for the rest
of the session and switches tracing off (``OTEL_SDK_DISABLED``) after each of its tests, so
the runtimes of other tests run as they would without it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import SpanKind, StatusCode

from client import KeyrangeConsumer
from client.protocol.keyspace import KeyRange, key_hash
from client.tracing import record_tracer, trace_headers
from client.worker import Worker
from tests.client.in_memory_source import InMemorySource
from tests.client.test_worker import config, group, running
from tests.fixtures.coordinator import MakeDatabase
from tests.fixtures.services import MakeTopic
from tests.streams.harness import increments
from tests.streams.test_runtime_offline import WORDS, Batch, Producer, word_count_runtime
from tests.streams.test_task import Rec
from tests.test_metrics import join_and_commit, serving
from tests.waiting import until


class Collecting(SpanProcessor):
    """Keeps ended spans while a test of this module collects; drops them otherwise."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] | None = None

    def on_end(self, span: ReadableSpan) -> None:
        if self.spans is not None:
            self.spans.append(span)


_COLLECTING = Collecting()


@pytest.fixture
def spans() -> Iterator[list[ReadableSpan]]:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(_COLLECTING)
        trace.set_tracer_provider(provider)
    _COLLECTING.spans = []
    os.environ["OTEL_SDK_DISABLED"] = "false"
    try:
        yield _COLLECTING.spans
    finally:
        _COLLECTING.spans = None
        # Runtimes started by later tests find tracing off, as they would without this module.
        os.environ["OTEL_SDK_DISABLED"] = "true"


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


async def produce_in_span(bootstrap: str, topic: str, key: bytes) -> trace.SpanContext:
    """One record produced inside a span, its context in the record's headers."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        with trace.get_tracer("test").start_as_current_span("checkout") as span:
            await producer.send_and_wait(
                topic, key=key, value=b"v", partition=0, headers=trace_headers()
            )
            return span.get_span_context()
    finally:
        await producer.stop()


async def read_headers(bootstrap: str, topic: str) -> list[tuple[str, bytes]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        async with asyncio.timeout(30):
            while True:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    return list(records[0].headers)
    finally:
        await consumer.stop()


def traceparent(headers: Sequence[tuple[str, bytes]]) -> tuple[int, int]:
    """The trace id and parent span id a ``traceparent`` header carries."""
    value = dict(headers)["traceparent"].decode()
    _, trace_id, span_id, _ = value.split("-")
    return int(trace_id, 16), int(span_id, 16)


@pytest.mark.parametrize("on_thread", [False, True], ids=["loop", "thread"])
async def test_a_record_is_one_trace_from_its_producer_through_the_worker_to_its_output(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    spans: list[ReadableSpan],
    on_thread: bool,
) -> None:
    topic, output = await make_topic(1), await make_topic(1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    tried: list[int] = []

    def handled_span() -> None:
        # Fails once, so the record is tried again: the retry is an event of its span.
        tried.append(1)
        if len(tried) == 1:
            raise ValueError("first try fails")
        with trace.get_tracer("test").start_as_current_span("charge"):
            pass

    async def on_loop(record: Any) -> None:
        handled_span()
        await producer.send_and_wait(output, b"out", partition=0, headers=trace_headers())

    def in_thread(record: Any) -> None:
        handled_span()
        asyncio.run_coroutine_threadsafe(
            producer.send_and_wait(output, b"out", partition=0, headers=trace_headers()), loop
        ).result(30)

    loop = asyncio.get_running_loop()
    group_id = group()
    worker = Worker(
        config(
            topic,
            kafka_bootstrap,
            coordinator_url,
            group_id,
            failure_policy="retry",
            retry_backoff_s=0.01,
        ),
        handler=in_thread if on_thread else on_loop,
    )
    try:
        async with running(worker):
            produced = await produce_in_span(kafka_bootstrap, topic, b"order-1")
            await until(lambda: worker.stats.processed == 1, 60, "the record processed")
        out_headers = await read_headers(kafka_bootstrap, output)
    finally:
        await producer.stop()

    (process,) = named(spans, f"process {topic}")
    assert process.kind is SpanKind.CONSUMER
    assert process.parent is not None
    assert (process.context.trace_id, process.parent.span_id) == (
        produced.trace_id,
        produced.span_id,
    )
    attributes = dict(process.attributes or {})
    assert attributes["messaging.system"] == "kafka"
    assert attributes["messaging.destination.name"] == topic
    assert attributes["messaging.destination.partition.id"] == "0"
    assert attributes["messaging.kafka.offset"] == 0
    assert attributes["messaging.consumer.group.name"] == group_id
    assert attributes["keyrange.key_hash"] == key_hash(b"order-1", 0)
    assert attributes["keyrange.runtime"] == "worker"
    assert attributes["keyrange.attempt"] == 2
    assert attributes["keyrange.outcome"] == "processed"
    assert str(attributes["keyrange.member_id"])
    assert process.status.status_code is StatusCode.OK
    (retry,) = process.events
    assert retry.name == "retry"
    assert dict(retry.attributes or {})["exception.type"] == "ValueError"
    # The handler's own span, on the loop or on a pool thread, nests under the record's.
    (charge,) = named(spans, "charge")
    assert charge.parent is not None and charge.parent.span_id == process.context.span_id
    # What the handler produced carries the trace on.
    assert traceparent(out_headers) == (produced.trace_id, process.context.span_id)


async def test_run_traces_each_record_as_the_child_of_its_producer(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, spans: list[ReadableSpan]
) -> None:
    topic = await make_topic(1)
    produced = await produce_in_span(kafka_bootstrap, topic, b"k")
    group_id = group()
    handled = asyncio.Event()
    async with KeyrangeConsumer(
        bootstrap_servers=kafka_bootstrap,
        coordinator_url=coordinator_url,
        group_id=group_id,
        auto_commit_interval_ms=None,
    ) as consumer:
        consumer.assign({TopicPartition(topic, 0): [KeyRange.full()]})

        async def handler(record: Any) -> None:
            handled.set()

        running_consumer = asyncio.create_task(consumer.run(handler))
        await asyncio.wait_for(handled.wait(), 30)
        await until(lambda: named(spans, f"process {topic}"), 10, "the record's span")
        await consumer.stop()
        await asyncio.wait_for(running_consumer, 30)
    (process,) = named(spans, f"process {topic}")
    assert process.parent is not None and process.parent.span_id == produced.span_id
    attributes = dict(process.attributes or {})
    assert (attributes["keyrange.runtime"], attributes["keyrange.outcome"]) == ("run", "processed")


async def test_streams_sinks_carry_the_trace_of_the_record_they_came_from(
    spans: list[ReadableSpan],
) -> None:
    tracer = record_tracer("streams", "app", lambda: "member-1")
    assert tracer is not None
    source = InMemorySource()
    producer = HeaderProducer()
    words = WORDS

    async def commit() -> None:
        return None

    runtime = word_count_runtime(source, producer, commit, tracer)
    source.grant(words)
    runtime.assigned({words: [KeyRange.full()]})
    running_runtime = asyncio.create_task(runtime.run())
    with trace.get_tracer("test").start_as_current_span("upload") as upload:
        headers = trace_headers()
    ((key, value, _),) = increments(["a"])
    source.items.put_nowait((words, Rec("words", 0, key, value, 1_000, headers=headers), 0))
    await until(lambda: producer.to("counts"), 10, "the count")
    await runtime.stopping(5)
    await asyncio.wait_for(running_runtime, 5)
    (process,) = named(spans, "process words")
    assert process.parent is not None
    assert process.parent.span_id == upload.get_span_context().span_id
    assert dict(process.attributes or {})["keyrange.member_id"] == "member-1"
    (sent,) = producer.to("counts")
    assert traceparent(sent) == (upload.get_span_context().trace_id, process.context.span_id)


class HeaderProducer(Producer):
    """The offline producer, keeping each record's headers."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[tuple[str, list[tuple[str, bytes]]]] = []

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        self.headers.extend((topic, headers) for _, _, headers in batch.records)
        return await super().send_batch(batch, topic, partition=partition)

    def to(self, topic: str) -> list[list[tuple[str, bytes]]]:
        return [headers for sent_to, headers in self.headers if sent_to == topic]


def test_tracing_switched_off_costs_a_runtime_nothing(
    spans: list[ReadableSpan], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert record_tracer("worker", "g", lambda: None) is None


async def test_the_coordinators_routes_are_traced_but_not_its_probes(
    make_migrated_database: MakeDatabase, spans: list[ReadableSpan]
) -> None:
    async with serving(await make_migrated_database()) as api:
        await join_and_commit(api, "traced-group")
        assert (await api.get("/livez")).status_code == 200
    routes = {dict(span.attributes or {}).get("http.route") for span in spans}
    assert "/v1/groups/{group_id}/heartbeat" in routes
    assert "/livez" not in routes
    # The commit route, served ahead of FastAPI, says where a commit's time went.
    (commit,) = named(spans, "POST /v1/groups/{group_id}/offsets/commit")
    assert commit.kind is SpanKind.SERVER
    assert dict(commit.attributes or {})["http.response.status_code"] == 200
    parts = {
        span.name: span
        for span in spans
        if span.parent is not None and span.parent.span_id == commit.context.span_id
    }
    assert set(parts) == {"commit admission", "commit queue", "commit transaction"}
    admission, queue, transaction = (
        parts[name] for name in ("commit admission", "commit queue", "commit transaction")
    )
    assert admission.end_time == queue.start_time
    assert queue.end_time == transaction.start_time
    assert commit.start_time <= admission.start_time
    assert transaction.end_time <= commit.end_time
    assert dict(transaction.attributes or {})["keyrange.commit.batch_requests"] == 1
