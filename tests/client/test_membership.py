"""One group member against the real coordinator and the embedded broker: join, commit with
its epoch, leave, lose its slices (removed, coordinator unreachable) and rejoin."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
import uvicorn
from aiokafka.structs import TopicPartition

from client import CoordinatorClient, KeyRange, KeyrangeConsumer, RebalanceListener, errors
from client.http import PartitionCommit, Slices
from coordinator.app import create_app
from tests.client.test_consumer import KEYS, produce, take
from tests.fixtures.coordinator import MakeDatabase, free_port, settings_for_tests
from tests.fixtures.services import MakeTopic

FULL = [KeyRange.full()]


class Recorder(RebalanceListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, Slices]] = []
        self.changed = asyncio.Event()

    async def on_slices_assigned(self, slices: Slices) -> None:
        self._add("assigned", slices)

    async def on_slices_revoked(self, slices: Slices) -> None:
        self._add("revoked", slices)

    async def on_slices_lost(self, slices: Slices) -> None:
        self._add("lost", slices)

    def _add(self, kind: str, slices: Slices) -> None:
        self.events.append((kind, slices))
        self.changed.set()

    async def wait_for(self, kind: str, count: int = 1) -> None:
        async with asyncio.timeout(30):
            while sum(event == kind for event, _ in self.events) < count:
                self.changed.clear()
                await self.changed.wait()


def group() -> str:
    return f"m-{uuid.uuid4().hex[:10]}"


def member(
    topic: str,
    bootstrap: str,
    coordinator: str,
    group_id: str,
    listener: Recorder,
    **options: object,
) -> KeyrangeConsumer:
    return KeyrangeConsumer(
        topic,
        bootstrap_servers=bootstrap,
        coordinator_url=coordinator,
        group_id=group_id,
        rebalance_listener=listener,
        **{"session_timeout_ms": 2_000, "auto_commit_interval_ms": 200, **options},  # type: ignore[arg-type]
    )


async def test_a_member_owns_every_partition_commits_with_its_epoch_and_leaves(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(2)
    for partition in (0, 1):
        await produce(kafka_bootstrap, topic, KEYS, partition=partition)
    group_id = group()
    listener = Recorder()
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    async with CoordinatorClient(coordinator_url) as api:
        async with member(topic, kafka_bootstrap, coordinator_url, group_id, listener) as consumer:
            await listener.wait_for("assigned")
            assert consumer.assignment() == dict.fromkeys(tps, FULL)
            assert consumer.member_id is not None and consumer.member_epoch
            await take(consumer, 2 * len(KEYS))
            await consumer.commit()
            committed = await api.fetch_offsets(group_id, [topic])
            assert {tp: committed[tp].stable_offset for tp in tps} == dict.fromkeys(tps, len(KEYS))
            with pytest.raises(errors.UnknownMemberId):
                await api.commit(group_id, [PartitionCommit(topic, 0, offset=len(KEYS))])
        assert listener.events[-1] == ("revoked", dict.fromkeys(tps, FULL))
        # Left the group: a standalone commit is accepted again.
        await api.commit(group_id, [PartitionCommit(topic, 0, offset=len(KEYS))])


async def test_a_member_removed_by_the_coordinator_loses_its_slices_and_rejoins(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    group_id = group()
    listener = Recorder()
    async with member(topic, kafka_bootstrap, coordinator_url, group_id, listener) as consumer:
        await listener.wait_for("assigned")
        first_id = consumer.member_id
        async with httpx.AsyncClient(base_url=coordinator_url) as admin:
            removed = await admin.delete(f"/v1/admin/groups/{group_id}/members/{first_id}")
            assert removed.status_code in (200, 204)
        await listener.wait_for("lost")
        await listener.wait_for("assigned", 2)
        assert consumer.member_id not in (None, first_id)
        assert consumer.assignment() == {TopicPartition(topic, 0): FULL}
    kinds = [kind for kind, _ in listener.events]
    assert kinds[:3] == ["assigned", "lost", "assigned"]


class Server:
    """The coordinator on a fixed port, so it can go away and come back at the same URL."""

    def __init__(self, database_url: str, kafka_bootstrap: str, port: int) -> None:
        self.database_url = database_url
        self.kafka_bootstrap = kafka_bootstrap
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        settings = settings_for_tests(kafka_bootstrap=self.kafka_bootstrap)
        app = create_app(settings, self.database_url)
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_config=None, access_log=False
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        for _ in range(500):  # uvicorn exposes no started event, only a flag
            if self._server.started:
                return
            await asyncio.sleep(0.02)
        raise RuntimeError("coordinator did not start within 10 s")

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
            self._server = self._task = None


@pytest_asyncio.fixture
async def server(
    make_migrated_database: MakeDatabase, kafka_bootstrap: str
) -> AsyncIterator[Server]:
    running = Server(await make_migrated_database(), kafka_bootstrap, free_port())
    await running.start()
    yield running
    await running.stop()


async def test_a_coordinator_gone_for_a_session_timeout_loses_the_slices_until_it_returns(
    kafka_bootstrap: str, server: Server, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    listener = Recorder()
    async with member(topic, kafka_bootstrap, server.url, group(), listener) as consumer:
        await listener.wait_for("assigned")
        await server.stop()
        await listener.wait_for("lost")
        assert consumer.assignment() == {}
        await server.start()
        await listener.wait_for("assigned", 2)
        assert consumer.assignment() == {TopicPartition(topic, 0): FULL}
