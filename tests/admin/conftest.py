"""A coordinator wired to the broker, with a topic whose records carry known timestamps, for
the CLI tests: the table views, every reset mode, and a live group sharing a partition."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import httpx
import pytest_asyncio
from aiokafka import AIOKafkaProducer

from coordinator.kafka import ClusterMetadata
from tests.fixtures.coordinator import MakeDatabase, RunningCoordinator

ADMIN_TOKEN = "cli-admin-token"
PARTITIONS = 2
RECORDS = 40
# Record i of each partition is stamped FIRST_TIMESTAMP_MS + i seconds.
FIRST_TIMESTAMP_MS = 1_780_000_000_000


@dataclass
class CliCluster:
    url: str
    api: httpx.AsyncClient
    topic: str

    def group(self, prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:8]}"

    async def commit(self, group: str, partition: int, **state: object) -> None:
        reply = await self.api.post(
            f"/v1/groups/{group}/offsets/commit",
            json={"partitions": [{"topic": self.topic, "partition": partition, **state}]},
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["partitions"][0]["error"] is None, reply.text

    async def stable_offsets(self, group: str) -> dict[int, int]:
        reply = await self.api.get(f"/v1/admin/groups/{group}/offsets")
        assert reply.status_code == 200, reply.text
        return {p["partition"]: p["stable_offset"] for p in reply.json()["partitions"]}


async def produce_stamped(bootstrap: str, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1, enable_idempotence=False)
    await producer.start()
    try:
        for partition in range(PARTITIONS):
            for index in range(RECORDS):
                await producer.send_and_wait(
                    topic,
                    key=b"key-%d" % index,
                    value=b"%d" % index,
                    partition=partition,
                    timestamp_ms=FIRST_TIMESTAMP_MS + index * 1000,
                )
    finally:
        await producer.stop()


@pytest_asyncio.fixture(scope="module")
async def cli_cluster(
    make_migrated_database: MakeDatabase,
    start_coordinator: Callable[..., Awaitable[RunningCoordinator]],
    kafka_bootstrap: str,
    cluster_metadata: ClusterMetadata,
) -> AsyncIterator[CliCluster]:
    topic = f"cli-orders-{uuid.uuid4().hex[:6]}"
    await cluster_metadata.create_topic(topic, PARTITIONS)
    await produce_stamped(kafka_bootstrap, topic)
    coordinator = await start_coordinator(
        await make_migrated_database(), kafka_bootstrap=kafka_bootstrap, admin_tokens=[ADMIN_TOKEN]
    )
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=coordinator.url, headers=headers, timeout=10) as api:
        yield CliCluster(coordinator.url, api, topic)
