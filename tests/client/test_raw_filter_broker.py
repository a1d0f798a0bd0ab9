"""The raw filter on a broker's fetch answers, against aiokafka's own consumer on the same topic.

aiokafka's consumer reads the topic whole (the oracle); a Keyrange member must get exactly the
records of it whose key hash lies in its ranges, equal field by field (offsets, keys, values,
headers, timestamps and their type, sizes), in the C path and in the pure-Python path. The
topic holds plain and compressed batches (every codec whose library is installed), headers,
null keys and values, and batches larger than a fetch's partition limit; a member that starts
where its group committed starts inside a compressed batch. Run against the embedded broker
(docs/architecture.md, "The raw filter", says what was tested where).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.codec import has_lz4, has_snappy, has_zstd
from aiokafka.structs import TopicPartition

from client import KeyRange, KeyrangeConsumer, key_hash, raw_filter
from tests.fixtures.services import MakeTopic

CODECS: list[str | None] = [None, "gzip"] + [
    name for name, has in (("snappy", has_snappy), ("lz4", has_lz4), ("zstd", has_zstd)) if has()
]
# Below the oversized batches' size: the broker still answers with the whole first batch.
FETCH_BYTES = 16 * 1024
QUARTER = KeyRange.full().split(4)[1]


async def produce_mixed(bootstrap: str, topic: str) -> int:
    """Batches of every codec here, then oversized ones; returns how many records."""
    count = 0
    for codec in CODECS:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, compression_type=codec, linger_ms=50
        )
        await producer.start()
        try:
            for index in range(150):
                key = None if index % 11 == 0 else b"key-%d" % (index % 37)
                value = None if index % 11 == 5 else b"value-%d" % index
                headers = [("trace", b"t%d" % index), ("empty", b"")] if index % 3 else []
                await producer.send(topic, key=key, value=value, headers=headers, partition=0)
                count += 1
            await producer.flush()
        finally:
            await producer.stop()
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=50, max_batch_size=256 * 1024
    )
    await producer.start()
    try:
        for index in range(40):
            await producer.send(topic, key=b"big-%d" % index, value=b"x" * 4000, partition=0)
            count += 1
        await producer.flush()
    finally:
        await producer.stop()
    return count


async def read_all(bootstrap: str, topic: str, count: int) -> list[Any]:
    """The oracle: aiokafka's consumer, from the log start, everything."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=FETCH_BYTES,
    )
    await consumer.start()
    records: list[Any] = []
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        async with asyncio.timeout(60):
            while len(records) < count:
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    records.extend(batch)
    finally:
        await consumer.stop()
    return records


def member(bootstrap: str, coordinator: str, group_id: str) -> KeyrangeConsumer:
    return KeyrangeConsumer(
        bootstrap_servers=bootstrap,
        coordinator_url=coordinator,
        group_id=group_id,
        auto_commit_interval_ms=None,
        max_partition_fetch_bytes=FETCH_BYTES,
    )


async def take(consumer: KeyrangeConsumer, count: int) -> list[Any]:
    taken: list[Any] = []
    async with asyncio.timeout(60):
        while len(taken) < count:
            batch = await consumer.getmany(timeout_ms=500, max_records=count - len(taken))
            for records in batch.values():
                taken.extend(records)
                consumer.mark_all_processed(records)
    return taken


@pytest.fixture(params=["c", "python"])
def judged_in(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(raw_filter, "native", None)
    return str(request.param)


@pytest.mark.parametrize("keys", [QUARTER, KeyRange.full()], ids=["quarter", "whole"])
async def test_a_member_gets_exactly_aiokafkas_records_of_its_keys(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    judged_in: str,
    keys: KeyRange,
) -> None:
    topic = await make_topic(1)
    count = await produce_mixed(kafka_bootstrap, topic)
    everything = await read_all(kafka_bootstrap, topic, count)
    expected = [r for r in everything if keys.contains(key_hash(r.key, r.offset))]
    assert any(r.headers for r in expected)
    async with member(kafka_bootstrap, coordinator_url, f"g-{uuid.uuid4().hex[:8]}") as consumer:
        assert consumer._fetcher.judges_in_c == (judged_in == "c")
        consumer.assign({TopicPartition(topic, 0): [keys]})
        assert await take(consumer, len(expected)) == expected
        assert await consumer.getmany(timeout_ms=300) == {}


async def test_a_member_resuming_inside_a_compressed_batch_starts_where_the_group_left(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, judged_in: str
) -> None:
    topic = await make_topic(1)
    count = await produce_mixed(kafka_bootstrap, topic)
    everything = await read_all(kafka_bootstrap, topic, count)
    # Inside the gzip records, which the producer wrote as a few batches of many records.
    resume = 150 + 75
    tp = TopicPartition(topic, 0)
    group_id = f"g-{uuid.uuid4().hex[:8]}"
    async with member(kafka_bootstrap, coordinator_url, group_id) as first:
        first.assign({tp: [KeyRange.full()]})
        taken = await take(first, resume)
        assert taken == everything[:resume]
        await first.commit()
    async with member(kafka_bootstrap, coordinator_url, group_id) as second:
        second.assign({tp: [KeyRange.full()]})
        assert await take(second, count - resume) == everything[resume:]
