"""``keyrange topic``: a newcomer's topic and test records from the command that runs
everything else, against the embedded broker (issue 47 item 3)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from coordinator.kafka import ClusterMetadata

ROOT = Path(__file__).resolve().parents[2]


async def keyrange_topic(*argv: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "client.cli",
        "topic",
        *argv,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def read_all(bootstrap: str, topic: str, count: int) -> list[tuple[bytes, bytes]]:
    kafka = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await kafka.start()
    try:
        kafka.assign([TopicPartition(topic, 0)])
        records: list[tuple[bytes, bytes]] = []
        async with asyncio.timeout(30):
            while len(records) < count:
                for batch in (await kafka.getmany(timeout_ms=500)).values():
                    records.extend((r.key, r.value) for r in batch)
        return records
    finally:
        await kafka.stop()


async def test_create_list_and_produce(
    kafka_bootstrap: str, cluster_metadata: ClusterMetadata
) -> None:
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    code, out, err = await keyrange_topic(
        "create", topic, "--partitions", "1", "--bootstrap", kafka_bootstrap
    )
    assert code == 0, err
    assert f"created topic {topic} with 1 partition(s)" in out
    assert await cluster_metadata.partition_counts([topic]) == {topic: 1}

    code, out, _ = await keyrange_topic("list", "--bootstrap", kafka_bootstrap)
    assert code == 0 and f"{topic}\t1 partition(s)" in out.splitlines()

    code, out, err = await keyrange_topic(
        "produce", topic, "--count", "50", "--keys", "5", "--bootstrap", kafka_bootstrap
    )
    assert code == 0, err
    assert "produced 50 records with 5 keys" in out
    records = await read_all(kafka_bootstrap, topic, 50)
    assert len(records) == 50
    assert {key for key, _ in records} == {b"key-%d" % k for k in range(5)}
    assert records[7] == (b"key-2", b'{"n": 7}')


async def test_an_existing_topic_is_not_created_again(
    kafka_bootstrap: str, cluster_metadata: ClusterMetadata
) -> None:
    topic = f"twice-{uuid.uuid4().hex[:8]}"
    await cluster_metadata.create_topic(topic, 2)
    code, _, err = await keyrange_topic("create", topic, "--bootstrap", kafka_bootstrap)
    assert code == 2
    assert err.strip() == f"keyrange topic: topic '{topic}' exists already"
    assert await cluster_metadata.partition_counts([topic]) == {topic: 2}


async def test_produce_to_a_missing_topic_is_refused_and_creates_nothing(
    kafka_bootstrap: str, cluster_metadata: ClusterMetadata
) -> None:
    topic = f"absent-{uuid.uuid4().hex[:8]}"
    code, _, err = await keyrange_topic("produce", topic, "--bootstrap", kafka_bootstrap)
    assert code == 2
    assert f"topic '{topic}' does not exist; create it first" in err
    assert await cluster_metadata.partition_counts([topic]) == {}


async def test_bad_options_are_one_line_and_exit_code_2(kafka_bootstrap: str) -> None:
    code, _, err = await keyrange_topic(
        "create", "t", "--config", "no-equals", "--bootstrap", kafka_bootstrap
    )
    assert code == 2 and err.strip() == "keyrange topic: --config 'no-equals' is not KEY=VALUE"
    code, _, err = await keyrange_topic("create", "t", "--partitions", "0")
    assert code == 2 and "must be at least 1" in err


async def test_an_unreachable_broker_is_one_line_and_exit_code_1() -> None:
    code, _, err = await keyrange_topic("list", "--bootstrap", "127.0.0.1:1")
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("keyrange topic: Kafka at 127.0.0.1:1"), lines
