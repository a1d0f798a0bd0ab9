from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from coordinator.embedded import EmbeddedBroker
from coordinator.kafka import ClusterMetadata, KafkaUnavailable
from tests.fixtures.services import MakeTopic


async def _produce(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1, enable_idempotence=False)
    await producer.start()
    try:
        for partition, count in counts.items():
            for index in range(count):
                await producer.send(topic, b"v", key=f"k{index}".encode(), partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_partition_counts_of_existing_topics(
    cluster_metadata: ClusterMetadata, make_topic: MakeTopic
) -> None:
    three = await make_topic(3)
    one = await make_topic(1)
    assert await cluster_metadata.partition_counts([three, one]) == {three: 3, one: 1}


async def test_unknown_topics_are_absent_and_not_created(
    cluster_metadata: ClusterMetadata, make_topic: MakeTopic
) -> None:
    known = await make_topic(2)
    unknown = f"never-created-{uuid.uuid4().hex[:8]}"
    assert await cluster_metadata.partition_counts([known, unknown]) == {known: 2}
    assert await cluster_metadata.high_watermarks([(unknown, 0), (known, 7)]) == {}
    assert unknown not in await cluster_metadata.list_topics()


async def test_list_topics_includes_created_topics(
    cluster_metadata: ClusterMetadata, make_topic: MakeTopic
) -> None:
    first, second = await make_topic(1), await make_topic(4)
    assert {first, second} <= await cluster_metadata.list_topics()


async def test_create_topic_is_idempotent(cluster_metadata: ClusterMetadata) -> None:
    name = f"idempotent-{uuid.uuid4().hex[:8]}"
    assert await cluster_metadata.create_topic(name, 2) is True
    assert await cluster_metadata.create_topic(name, 5) is False
    assert await cluster_metadata.partition_counts([name]) == {name: 2}


async def test_create_topic_refuses_zero_partitions(cluster_metadata: ClusterMetadata) -> None:
    name = f"empty-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ValueError, match="at least one partition"):
        await cluster_metadata.create_topic(name, 0)
    assert await cluster_metadata.partition_counts([name]) == {}


async def test_high_watermarks_count_the_records_produced(
    kafka_bootstrap: str, cluster_metadata: ClusterMetadata, make_topic: MakeTopic
) -> None:
    topic = await make_topic(4)
    partitions = [(topic, p) for p in range(4)]
    assert await cluster_metadata.high_watermarks(partitions) == dict.fromkeys(partitions, 0)

    await _produce(kafka_bootstrap, topic, {0: 5, 2: 12, 3: 1})
    assert await cluster_metadata.high_watermarks(partitions) == {
        (topic, 0): 5,
        (topic, 1): 0,
        (topic, 2): 12,
        (topic, 3): 1,
    }

    # Later calls fetch from the last watermark seen; new records must still show.
    await _produce(kafka_bootstrap, topic, {1: 3, 2: 2})
    assert await cluster_metadata.high_watermarks(partitions) == {
        (topic, 0): 5,
        (topic, 1): 3,
        (topic, 2): 14,
        (topic, 3): 1,
    }


async def test_high_watermarks_for_hundreds_of_partitions_and_several_topics(
    kafka_bootstrap: str, cluster_metadata: ClusterMetadata, make_topic: MakeTopic
) -> None:
    wide, narrow = await make_topic(200), await make_topic(3)
    await _produce(kafka_bootstrap, wide, {p: p % 4 for p in range(0, 200, 7)})
    await _produce(kafka_bootstrap, narrow, {1: 2})
    expected = {(wide, p): (p % 4 if p % 7 == 0 else 0) for p in range(200)}
    expected |= {(narrow, 0): 0, (narrow, 1): 2, (narrow, 2): 0}
    assert await cluster_metadata.high_watermarks(expected) == expected


async def test_empty_requests_need_no_cluster() -> None:
    cluster = ClusterMetadata(f"127.0.0.1:{_closed_port()}", request_timeout_ms=500)
    assert await cluster.partition_counts([]) == {}
    assert await cluster.high_watermarks([]) == {}
    await cluster.close()


@pytest.mark.timeout(30)
async def test_closed_port_is_kafka_unavailable() -> None:
    cluster = ClusterMetadata(f"127.0.0.1:{_closed_port()}", request_timeout_ms=1_000)
    try:
        with pytest.raises(KafkaUnavailable, match=r"unreachable|did not answer") as caught:
            await cluster.start()
        assert caught.value.retriable is True
        with pytest.raises(KafkaUnavailable):
            await cluster.partition_counts(["anything"])
        with pytest.raises(KafkaUnavailable):
            await cluster.high_watermarks([("anything", 0)])
    finally:
        await cluster.close()


@pytest.mark.kafka
@pytest.mark.timeout(60)
async def test_a_stopped_broker_becomes_kafka_unavailable(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path / "broker")
    cluster = ClusterMetadata(broker.start(), request_timeout_ms=1_000)
    try:
        await cluster.create_topic("short-lived", 2)
        assert await cluster.partition_counts(["short-lived"]) == {"short-lived": 2}
        broker.stop()
        with pytest.raises(KafkaUnavailable):
            await cluster.high_watermarks([("short-lived", 0)])
    finally:
        broker.stop()
        await cluster.close()


@pytest.mark.kafka
@pytest.mark.timeout(60)
async def test_a_reader_that_started_before_kafka_recovers_once_it_is_up(tmp_path: Path) -> None:
    port = _closed_port()
    cluster = ClusterMetadata(f"127.0.0.1:{port}", request_timeout_ms=1_000)
    broker = EmbeddedBroker(tmp_path / "broker", port=port)
    try:
        with pytest.raises(KafkaUnavailable):
            await cluster.start()
        broker.start()
        await cluster.create_topic("late", 3)
        assert await cluster.partition_counts(["late"]) == {"late": 3}
    finally:
        broker.stop()
        await cluster.close()
