"""A member subscribed to a topic that does not exist says so, and creates nothing (issue 47
item 4: it used to wait in silence)."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from aiokafka import AIOKafkaConsumer

from client.consumer import KeyrangeConsumer
from client.topic_watch import watch_missing_topics
from coordinator.kafka import ClusterMetadata
from tests.waiting import until


def warnings_naming(caplog: pytest.LogCaptureFixture, topic: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and topic in r.getMessage()
    ]


async def test_a_member_on_a_missing_topic_warns_and_does_not_create_it(
    kafka_bootstrap: str,
    coordinator_url: str,
    cluster_metadata: ClusterMetadata,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="client.topic_watch")
    topic = f"missing-{uuid.uuid4().hex[:8]}"
    consumer = KeyrangeConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        coordinator_url=coordinator_url,
        group_id=f"g-{topic}",
        auto_commit_interval_ms=None,
        session_timeout_ms=3000,
    )
    async with consumer:
        await until(lambda: warnings_naming(caplog, topic), 30, "a warning naming the topic")
    assert "keyrange topic create" in warnings_naming(caplog, topic)[0]
    assert topic not in await cluster_metadata.partition_counts([topic])


async def test_the_watch_says_when_the_topic_appears_and_ends(
    kafka_bootstrap: str, cluster_metadata: ClusterMetadata, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="client.topic_watch")
    topic = f"later-{uuid.uuid4().hex[:8]}"
    kafka = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap)
    await kafka.start()
    try:

        async def existing() -> set[str]:
            return set(await kafka.topics())

        watch = asyncio.create_task(watch_missing_topics([topic], existing, interval_s=0.2))
        await until(lambda: warnings_naming(caplog, topic), 30, "a warning naming the topic")
        assert not watch.done()
        await cluster_metadata.create_topic(topic, 1)
        async with asyncio.timeout(30):
            await watch
    finally:
        await kafka.stop()
    appeared = [r for r in caplog.records if r.getMessage() == "subscribed topics exist now"]
    assert appeared and appeared[0].__dict__["topics"] == [topic]
