"""Headers from input records to sinks, with the real broker: an input record's headers reach
the sink through intermediate processors, a punctuation's records carry none, a ``forward``
given headers replaces them downstream, and changelog records carry none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from client.streams import (
    STREAM_TIME,
    STRING,
    Processor,
    ProcessorContext,
    ProcessorFailed,
    StoreSpec,
    StreamsApp,
    Topology,
)
from client.streams.config import StreamsConfig
from tests.fixtures.services import MakeTopic
from tests.streams.harness import TopicReader, running
from tests.streams.test_task import Rec, run_all, task_of
from tests.waiting import until

OVERRIDE = [("trace", b"replaced"), ("tenant", b"t-9")]


class Tag(Processor):
    """Forwards each record unchanged, except ``override`` records, forwarded with
    ``OVERRIDE``; a stream-time punctuation every 1,000 ms forwards a ``tick``."""

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        context.schedule(1_000, STREAM_TIME, self.tick)

    def process(self, key: Any, value: Any) -> None:
        if value == "override":
            self.context.forward(key, value, headers=OVERRIDE)
        else:
            self.context.forward(key, value)

    def tick(self, at: int) -> None:
        self.context.forward(f"tick-{at}", "tick")


class Remember(Processor):
    """An intermediate processor that writes a store (a changelog record) and passes the
    record on, with the headers it sees appended to the value."""

    def process(self, key: Any, value: Any) -> None:
        self.context.state_store("seen").put(key, value)
        seen = ",".join(name for name, _ in self.context.headers)
        self.context.forward(key, f"{value}|{seen}")


def topology(source: str, sink: str) -> Topology:
    return (
        Topology()
        .add_source("in", source, key_serde=STRING, value_serde=STRING)
        .add_processor("tag", Tag, "in")
        .add_processor("remember", Remember, "tag")
        .add_state_store(StoreSpec("seen", STRING, STRING), "remember")
        .add_sink("out", sink, "remember", key_serde=STRING, value_serde=STRING)
    )


async def test_headers_reach_the_sink_and_punctuations_and_changelogs_carry_none(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    source, sink = await make_topic(1), await make_topic(1)
    inputs = [
        (b"a", b"plain", 0, [("trace", b"t-1"), ("origin", b"web")]),
        (b"b", b"override", 500, [("trace", b"t-2")]),
        (b"c", b"bare", 700, []),
        # Stream time passes 1,000 on this record: the tick (given the stream time, 1,500)
        # fires right after it, while its headers were in effect.
        (b"d", b"late", 1_500, [("trace", b"t-4")]),
    ]
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for key, value, timestamp, headers in inputs:
            await producer.send(
                source, value=value, key=key, partition=0, timestamp_ms=timestamp, headers=headers
            )
        await producer.flush()
    finally:
        await producer.stop()
    app_id = f"headers-{source}"
    config = StreamsConfig(
        application_id=app_id,
        bootstrap_servers=kafka_bootstrap,
        coordinator_url=coordinator_url,
        state_dir=tmp_path,
        commit_interval_ms=200,
        session_timeout_ms=3_000,
        show_progress=False,
    )
    async with (
        running(StreamsApp(topology(source, sink), config)),
        TopicReader(kafka_bootstrap, sink) as output,
        TopicReader(kafka_bootstrap, f"{app_id}-seen-changelog") as changelog,
    ):

        async def all_out() -> bool:
            await output.poll()
            await changelog.poll()
            return len(output.records) == 5 and len(changelog.records) == 5

        await until(all_out, 60, "every record on the sink and the changelog")
    received = {
        record.key.decode(): (record.value.decode(), list(record.headers))
        for record in output.records
    }
    assert received == {
        "a": ("plain|trace,origin", [("trace", b"t-1"), ("origin", b"web")]),
        "b": ("override|trace,tenant", OVERRIDE),
        "c": ("bare|", []),
        "d": ("late|trace", [("trace", b"t-4")]),
        "tick-1500": ("tick|", []),
    }
    assert all(list(record.headers) == [] for record in changelog.records)


class BadHeaders(Processor):
    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, value, headers=[("trace", "not bytes")])  # type: ignore[list-item]


def test_headers_that_are_not_str_bytes_pairs_fail_the_processor_on_its_record() -> None:
    task = task_of(
        Topology()
        .add_source("in", "numbers", key_serde=STRING, value_serde=STRING)
        .add_processor("bad", BadHeaders, "in")
        .add_sink("out", "elsewhere", "bad", key_serde=STRING, value_serde=STRING)
    )
    task.add("numbers", Rec("numbers", 3, b"k", b"v", 0))
    with pytest.raises(ProcessorFailed, match=r"processor 'bad' failed on numbers\[0\]@3.*pair"):
        run_all(task)
    assert task.outgoing == []
