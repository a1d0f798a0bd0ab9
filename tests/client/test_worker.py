"""The worker runtime against the embedded broker and a real coordinator: tasks and their
lifecycle, observer acks (late, out of order, from threads), processing timeouts, per-key
order, and what the commits carry afterwards."""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiokafka.structs import TopicPartition

from client import CoordinatorClient, key_hash
from client.worker import (
    SubPartition,
    Worker,
    WorkerConfig,
    WorkerFailed,
    WorkerTask,
)
from client.worker.task import RecordObserver
from tests.client.test_consumer import produce
from tests.fixtures.services import MakeTopic
from tests.waiting import until

KEYS = [b"key-%d" % (i % 17) for i in range(150)]


def group() -> str:
    return f"w-{uuid.uuid4().hex[:10]}"


def config(
    topic: str, bootstrap: str, coordinator: str, group_id: str, **overrides: Any
) -> WorkerConfig:
    settings: dict[str, Any] = {
        "session_timeout_ms": 3_000,
        "commit_interval_ms": 200,
        "punctuate_interval_s": 0.2,
        "drain_timeout_s": 5.0,
        **overrides,
    }
    return WorkerConfig(
        topics=[topic],
        group_id=group_id,
        bootstrap_servers=bootstrap,
        coordinator_url=coordinator,
        **settings,
    )


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(worker.run())
    try:
        yield task
    finally:
        worker.stop()
        async with asyncio.timeout(60):
            await asyncio.gather(task, return_exceptions=True)


async def processed_offsets(coordinator: str, group_id: str, topic: str) -> set[int]:
    """Offsets of partition 0 the group's commits count as processed."""
    async with CoordinatorClient(coordinator) as api:
        state = (await api.fetch_offsets(group_id, [topic])).get(TopicPartition(topic, 0))
    if state is None:
        return set()
    return {
        offset
        for offset, key in enumerate(KEYS)
        if state.is_processed(offset, key_hash(key, offset))
    }


def all_committed(coordinator: str, group_id: str, topic: str, count: int) -> Callable[..., Any]:
    async def check() -> bool:
        return len(await processed_offsets(coordinator, group_id, topic)) == count

    return check


class Journal:
    """What tasks saw, shared by every task instance of one test."""

    def __init__(self) -> None:
        self.inits: list[SubPartition] = []
        self.closed: list[SubPartition] = []
        self.punctuated: set[int] = set()
        self.seen: dict[int, list[int]] = defaultdict(list)
        self.unacked_keys: set[bytes] = set()
        self.violations: list[str] = []
        self.acked: set[int] = set()
        self.lock = threading.Lock()


def threaded_task(journal: Journal) -> type[WorkerTask]:
    """Acknowledges each record later, from a thread, in an order of its own."""

    class ThreadAcks(WorkerTask):
        def init(self, subpartition: SubPartition, config: WorkerConfig) -> None:
            self.subpartition = subpartition
            self.busy = False
            journal.inits.append(subpartition)

        async def process(self, record: Any, observer: RecordObserver) -> None:
            if self.busy:
                journal.violations.append("two calls into one task at once")
            self.busy = True
            index = self.subpartition.index
            if key_hash(record.key, record.offset) % self.subpartition.count != index:
                journal.violations.append(f"offset {record.offset} in the wrong sub-partition")
            with journal.lock:
                if record.key in journal.unacked_keys:
                    journal.violations.append(f"offset {record.offset}: its key is unacked")
                journal.unacked_keys.add(record.key)
            journal.seen[index].append(record.offset)

            def ack() -> None:
                with journal.lock:
                    journal.unacked_keys.discard(record.key)
                    journal.acked.add(record.offset)
                observer.success()

            threading.Timer(random.uniform(0, 0.05), ack).start()
            await asyncio.sleep(0)
            self.busy = False

        def punctuate(self, now: float) -> None:
            journal.punctuated.add(self.subpartition.index)

        def close(self) -> None:
            journal.closed.append(self.subpartition)

    return ThreadAcks


async def test_tasks_get_their_subpartitions_in_order_and_late_thread_acks_commit(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS)
    group_id = group()
    journal = Journal()
    worker = Worker(
        config(topic, kafka_bootstrap, coordinator_url, group_id, subpartitions=4),
        task=threaded_task(journal),
    )
    async with running(worker):
        await until(lambda: len(journal.acked) == len(KEYS), 60, "every record acked")
        await until(all_committed(coordinator_url, group_id, topic, len(KEYS)), 30, "all committed")
        await until(lambda: journal.punctuated == {0, 1, 2, 3}, 30, "every task punctuated")
    assert journal.violations == []
    assert sorted(s.index for s in journal.inits) == [0, 1, 2, 3]
    assert sorted(s.index for s in journal.closed) == [0, 1, 2, 3]
    for index, offsets in journal.seen.items():
        assert offsets == sorted(offsets), f"sub-partition {index} out of order"
    assert sum(len(offsets) for offsets in journal.seen.values()) == len(KEYS)


async def test_a_record_without_an_ack_times_out_and_its_key_waits_until_then(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS)
    group_id = group()
    silent = 0  # offset 0 is never acknowledged
    later_same_key = [o for o, key in enumerate(KEYS) if key == KEYS[silent] and o != silent]
    started: dict[int, float] = {}

    class Forgetful(WorkerTask):
        def process(self, record: Any, observer: RecordObserver) -> None:
            started[record.offset] = time.monotonic()
            if record.offset != silent:
                observer.success()

    worker = Worker(
        config(
            topic,
            kafka_bootstrap,
            coordinator_url,
            group_id,
            processing_timeout_s=1.0,
            failure_policy="skip",
            subpartitions=16,
        ),
        task=Forgetful,
    )
    async with running(worker):
        await until(all_committed(coordinator_url, group_id, topic, len(KEYS)), 60, "all committed")
        assert worker.stats.failed == 1
        assert worker.stats.skipped == 1
    # The key's next record was handed out only after the silent one timed out.
    assert all(started[o] >= started[silent] + 1.0 for o in later_same_key)


async def test_at_least_once_stops_on_a_failure_and_a_restart_redelivers_its_key(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS)
    group_id = group()
    failing = 20
    bad_key = KEYS[failing]

    async def handle(record: Any) -> None:
        if record.offset == failing:
            raise RuntimeError("downstream refused")

    worker = Worker(config(topic, kafka_bootstrap, coordinator_url, group_id), handler=handle)
    with pytest.raises(WorkerFailed, match="downstream refused"):
        async with asyncio.timeout(60):
            await worker.run()
    done = await processed_offsets(coordinator_url, group_id, topic)
    assert failing not in done
    assert not {o for o in done if KEYS[o] == bad_key and o > failing}
    assert set(range(failing)) <= done

    again: list[int] = []

    async def record_all(record: Any) -> None:
        again.append(record.offset)

    second = Worker(config(topic, kafka_bootstrap, coordinator_url, group_id), handler=record_all)
    async with running(second):
        await until(all_committed(coordinator_url, group_id, topic, len(KEYS)), 60, "all committed")
    assert failing in again
    assert not set(again) & {o for o in range(failing)}
