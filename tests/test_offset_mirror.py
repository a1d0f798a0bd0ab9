"""The offset mirror: stable offsets committed into Kafka consumer groups, read back through
Kafka's own admin API as kafka-consumer-groups, Burrow or KEDA read them."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from coordinator.app import create_app
from coordinator.core.mirror import SkippedGroups
from coordinator.kafka import ClusterMetadata
from coordinator.kafka_groups import KafkaGroups
from coordinator.mirror import mirror_loops, mirror_once
from coordinator.settings import Settings
from tests.fixtures.coordinator import settings_for_tests
from tests.fixtures.services import MakeTopic
from tests.waiting import until

PREFIX = f"kr-{uuid.uuid4().hex[:6]}-"


@pytest_asyncio.fixture(scope="module")
async def mirroring(database_url: str, kafka_bootstrap: str) -> AsyncIterator[FastAPI]:
    app = create_app(
        settings_for_tests(
            kafka_bootstrap=kafka_bootstrap, mirror_offsets="all", mirror_group_prefix=PREFIX
        ),
        database_url,
    )
    async with app.router.lifespan_context(app):
        yield app


@pytest_asyncio.fixture(scope="module")
async def mirroring_api(mirroring: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=mirroring)
    async with httpx.AsyncClient(transport=transport, base_url="http://coordinator") as client:
        yield client


@pytest_asyncio.fixture
async def kafka_admin(kafka_bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def _own_round(
    engine: AsyncEngine, kafka: KafkaGroups, prefix: str, skipped: SkippedGroups
) -> dict[str, dict[tuple[str, int], int]]:
    """One mirror round of this test's own: the module's coordinator mirrors too, and holds
    the round now and then."""
    written: dict[str, dict[tuple[str, int], int]] | None = None

    async def taken() -> bool:
        nonlocal written
        written = await mirror_once(engine, kafka, prefix, skipped)
        return written is not None

    await until(taken, 30, "a mirror round not held by the coordinator")
    assert written is not None
    return written


async def _commit(api: httpx.AsyncClient, group: str, *entries: dict[str, object]) -> None:
    reply = await api.post(f"/v1/groups/{group}/offsets/commit", json={"partitions": list(entries)})
    assert reply.status_code == 200, reply.text


async def test_stable_offsets_are_read_back_through_kafkas_admin_api(
    mirroring_api: httpx.AsyncClient, kafka_admin: AIOKafkaAdminClient, make_topic: MakeTopic
) -> None:
    topic = await make_topic(2)
    await _commit(
        mirroring_api,
        "mirrored",
        {"topic": topic, "partition": 0, "offset": 5},
        {"topic": topic, "partition": 1, "ranges": [[0, 2], [7, 8]]},
    )
    wanted = [TopicPartition(topic, 0), TopicPartition(topic, 1)]

    async def in_kafka() -> dict[TopicPartition, int]:
        found = await kafka_admin.list_consumer_group_offsets(
            f"{PREFIX}mirrored", partitions=wanted
        )
        return {tp: meta.offset for tp, meta in found.items() if meta.offset >= 0}

    expected = {wanted[0]: 5, wanted[1]: 3}
    await until(lambda: _equals(in_kafka, expected), 30, "the stable offsets in Kafka")

    await _commit(mirroring_api, "mirrored", {"topic": topic, "partition": 0, "offset": 9})
    expected = {wanted[0]: 9, wanted[1]: 3}
    await until(lambda: _equals(in_kafka, expected), 30, "the newer stable offset in Kafka")


async def _equals(read: object, expected: dict[TopicPartition, int]) -> bool:
    assert callable(read)
    return bool(await read() == expected)


def test_mirroring_is_off_unless_asked_for() -> None:
    assert Settings.model_fields["mirror_offsets"].default == "off"
    assert mirror_loops(settings_for_tests()) == {}
    assert set(mirror_loops(settings_for_tests(mirror_offsets="all"))) == {"offset-mirror"}


async def test_a_kafka_group_with_live_members_is_left_alone_and_named_once(
    mirroring_api: httpx.AsyncClient,
    database_url: str,
    kafka_bootstrap: str,
    cluster_metadata: ClusterMetadata,
    kafka_admin: AIOKafkaAdminClient,
    make_topic: MakeTopic,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = await make_topic(1)
    prefix = f"live-{uuid.uuid4().hex[:6]}-"
    group = f"{prefix}busy"
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=kafka_bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    engine = create_async_engine(database_url)
    try:
        await until(lambda: consumer.assignment(), 30, "the Kafka consumer's assignment")
        await _commit(mirroring_api, "busy", {"topic": topic, "partition": 0, "offset": 4})
        caplog.set_level(logging.WARNING, logger="coordinator.mirror")
        skipped = SkippedGroups()
        kafka = KafkaGroups(cluster_metadata)
        for _ in range(3):
            written = await mirror_once(engine, kafka, prefix, skipped)
            assert group not in written
        found = await kafka_admin.list_consumer_group_offsets(
            group, partitions=[TopicPartition(topic, 0)]
        )
    finally:
        await engine.dispose()
        await consumer.stop()
    assert all(meta.offset != 4 for meta in found.values())
    named = [r for r in caplog.records if r.__dict__.get("kafka_group") == group]
    assert len(named) == 1 and named[0].levelno == logging.WARNING
    assert "live Kafka members" in named[0].getMessage()


async def test_only_offsets_kafka_does_not_hold_are_written(
    mirroring_api: httpx.AsyncClient,
    database_url: str,
    cluster_metadata: ClusterMetadata,
    make_topic: MakeTopic,
) -> None:
    topic = await make_topic(1)
    prefix = f"again-{uuid.uuid4().hex[:6]}-"
    await _commit(mirroring_api, "steady", {"topic": topic, "partition": 0, "offset": 6})
    engine = create_async_engine(database_url)
    try:
        kafka = KafkaGroups(cluster_metadata)
        first = await _own_round(engine, kafka, prefix, SkippedGroups())
        second = await _own_round(engine, kafka, prefix, SkippedGroups())
    finally:
        await engine.dispose()
    assert first[f"{prefix}steady"] == {(topic, 0): 6}
    assert f"{prefix}steady" not in second


async def test_a_round_another_replica_holds_is_skipped(
    database_url: str, cluster_metadata: ClusterMetadata
) -> None:
    engine = create_async_engine(database_url)
    try:
        async with engine.begin() as holder:
            # What a replica mid-round holds (coordinator.mirror's advisory lock).
            await holder.execute(text("SELECT pg_advisory_xact_lock(x'4B526D'::int, 0)"))
            skipped = await mirror_once(
                engine, KafkaGroups(cluster_metadata), "held-", SkippedGroups()
            )
    finally:
        await engine.dispose()
    assert skipped is None
