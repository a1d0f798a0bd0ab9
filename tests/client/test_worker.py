"""The worker runtime against the embedded broker and a real coordinator: tasks and their
lifecycle, observer acks (late, out of order, from threads), processing timeouts, per-key
order, and what the commits carry afterwards."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import sys
import threading
import time
import uuid
import weakref
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from client import CoordinatorClient, key_hash
from client.metrics_server import MetricsServer, MetricsUnavailable
from client.worker import (
    SubPartition,
    Worker,
    WorkerConfig,
    WorkerFailed,
    WorkerTask,
)
from client.worker.task import RecordObserver
from tests.client import worker_targets
from tests.client.test_consumer import produce
from tests.e2e.harness import allow_range_fetch
from tests.fixtures.coordinator import free_port
from tests.fixtures.services import MakeTopic
from tests.observability import dashboard_queries, problems
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


async def processed_offsets(
    coordinator: str, group_id: str, topic: str, keys: list[bytes] = KEYS
) -> set[int]:
    """Offsets of partition 0 the group's commits count as processed (``keys`` produced)."""
    async with CoordinatorClient(coordinator) as api:
        state = (await api.fetch_offsets(group_id, [topic])).get(TopicPartition(topic, 0))
    if state is None:
        return set()
    return {
        offset
        for offset, key in enumerate(keys)
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


async def test_a_record_acknowledged_after_its_timeout_keeps_its_key_until_then(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    """A task that acknowledges after ``process`` returned holds its key until it does, past
    ``processing_timeout_s`` too (issue 46 item 3): its bill may still be running."""
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS)
    group_id = group()
    late = 0  # offset 0 is acknowledged well after its timeout
    later_same_key = [o for o, key in enumerate(KEYS) if key == KEYS[late] and o != late]
    started: dict[int, float] = {}
    acknowledged: list[float] = []

    def acknowledge(observer: RecordObserver) -> None:
        acknowledged.append(time.time())
        observer.success()

    class Late(WorkerTask):
        def process(self, record: Any, observer: RecordObserver) -> None:
            started[record.offset] = time.time()
            if record.offset == late:
                threading.Timer(2.5, acknowledge, (observer,)).start()
            else:
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
        task=Late,
    )
    async with running(worker):
        await until(all_committed(coordinator_url, group_id, topic, len(KEYS)), 60, "all committed")
    # The late acknowledgement counted; no later record of its key started before it.
    assert worker.stats.failed == 0 and worker.stats.processed == len(KEYS)
    assert acknowledged and all(started[o] >= acknowledged[0] for o in later_same_key)


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


async def read_topic(bootstrap: str, topic: str, count: int) -> list[Any]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        records: list[Any] = []
        async with asyncio.timeout(30):
            while len(records) < count:
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    records.extend(batch)
        return records
    finally:
        await consumer.stop()


async def test_retries_then_dead_letters_in_key_order_while_other_keys_flow(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    dead_letters = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS)
    group_id = group()
    bad_key = KEYS[3]
    bad = [o for o, key in enumerate(KEYS) if key == bad_key]
    attempts: dict[int, int] = defaultdict(int)
    done_while_retrying: list[int] = []

    async def handle(record: Any) -> None:
        attempts[record.offset] += 1
        if record.key == bad_key:
            raise ValueError(f"cannot bill {record.offset}")
        if any(attempts[o] for o in bad) and len(attempts) < len(KEYS):
            done_while_retrying.append(record.offset)

    worker = Worker(
        config(
            topic,
            kafka_bootstrap,
            coordinator_url,
            group_id,
            failure_policy="retry",
            max_attempts=3,
            retry_backoff_s=0.05,
            retry_backoff_max_s=0.2,
            dead_letter_topic=dead_letters,
            max_concurrency=4,
        ),
        handler=handle,
    )
    started_ms = int(time.time() * 1000)
    async with running(worker):
        await until(all_committed(coordinator_url, group_id, topic, len(KEYS)), 60, "all committed")
        assert worker.stats.dead_lettered == len(bad)
        assert worker.stats.retried == 2 * len(bad)
    assert all(attempts[o] == 3 for o in bad)
    assert done_while_retrying, "other keys waited for the retrying one"
    letters = await read_topic(kafka_bootstrap, dead_letters, len(bad))
    assert [int(dict(r.headers)["keyrange.origin.offset"]) for r in letters] == bad
    first = letters[0]
    headers = {name: value.decode() for name, value in first.headers}
    assert first.key == bad_key and first.value == b"v%d" % bad[0]
    assert headers["keyrange.origin.topic"] == topic
    assert headers["keyrange.origin.partition"] == "0"
    assert headers["keyrange.key.hash"] == str(key_hash(bad_key, bad[0]))
    assert headers["keyrange.attempts"] == "3"
    assert headers["keyrange.error.type"] == "builtins.ValueError"
    assert headers["keyrange.error.message"] == f"cannot bill {bad[0]}"
    first_failure = int(headers["keyrange.failure.first"])
    assert started_ms <= first_failure < int(headers["keyrange.failure.last"])


async def test_a_dead_letter_the_broker_refuses_stops_the_worker_unprocessed(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS[:5])
    group_id = group()

    async def handle(record: Any) -> None:
        raise ValueError("always")

    worker = Worker(
        config(
            topic,
            kafka_bootstrap,
            coordinator_url,
            group_id,
            failure_policy="retry",
            max_attempts=1,
            # Longer than any topic name the broker takes: the send fails.
            dead_letter_topic="x" * 300,
        ),
        handler=handle,
        producer_options={"request_timeout_ms": 3_000, "max_block_ms": 3_000},
    )
    with pytest.raises(WorkerFailed, match="dead letter"):
        async with asyncio.timeout(60):
            await worker.run()
    assert await processed_offsets(coordinator_url, group_id, topic) == set()


@pytest.mark.parametrize("form", ["handler", "task"])
async def test_a_slice_revoked_while_its_record_waits_for_a_retry_goes_to_its_next_owner(
    form: str, kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await allow_range_fetch(coordinator_url, topic)
    await produce(kafka_bootstrap, topic, KEYS)
    group_id = group()
    # Every key fails on the first member, which waits long between tries; whichever half
    # of the key space the second member takes, records waiting for a retry are in it.
    first_attempts: list[int] = []

    async def failing(record: Any) -> None:
        first_attempts.append(record.offset)
        raise ConnectionError("downstream down")

    second_done: list[int] = []

    async def succeeding(record: Any) -> None:
        second_done.append(record.offset)

    options = {
        "failure_policy": "retry",
        "max_attempts": 50,
        "retry_backoff_s": 30.0,
        "retry_backoff_max_s": 30.0,
        "dead_letter_topic": f"{topic}-dlt",
    }

    class Failing(WorkerTask):
        async def process(self, record: Any, observer: RecordObserver) -> None:
            await failing(record)

    # A drain that waited for the retries would outlast every wait below.
    first_config = config(
        topic, kafka_bootstrap, coordinator_url, group_id, drain_timeout_s=300, **options
    )
    first = (
        Worker(first_config, handler=failing)
        if form == "handler"
        else Worker(first_config, task=Failing)
    )
    # Every key's first record in the handler form; each sub-partition's head with tasks.
    tried = 17 if form == "handler" else 1
    second = Worker(
        config(topic, kafka_bootstrap, coordinator_url, group_id, **options), handler=succeeding
    )
    async with running(first):
        await until(lambda: len(set(first_attempts)) >= tried, 60, "records in retry")
        async with running(second):
            await until(lambda: len(second_done) > 0, 60, "the second member to process")
            await until(lambda: second.consumer.assignment(), 30, "the second to own a slice")
            owned = second.consumer.assignment()[TopicPartition(topic, 0)]
            # The records of the moved slice that were waiting for a retry came back.
            moved = {
                o for o, key in enumerate(KEYS) if any(r.contains(key_hash(key, o)) for r in owned)
            }
            await until(lambda: moved <= set(second_done), 45, "the moved slice processed")
    assert first.stats.dead_lettered == 0
    assert moved and moved <= set(second_done)
    if form == "handler":
        assert moved & set(first_attempts), "no record waiting for a retry moved"


async def produce_values(bootstrap: str, topic: str, count: int, size: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for index in range(count):
            await producer.send(topic, key=b"k%d" % (index % 50), value=b"x" * size, partition=0)
        await producer.flush()
    finally:
        await producer.stop()


async def test_fetching_pauses_over_the_byte_bound_and_resumes_below_it(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce_values(kafka_bootstrap, topic, 30, 2_000)
    group_id = group()
    release = asyncio.Event()
    held: list[RecordObserver] = []
    done: list[int] = []
    bound = 40_000

    class Holding(WorkerTask):
        async def process(self, record: Any, observer: RecordObserver) -> None:
            done.append(record.offset)
            if release.is_set():
                observer.success()
            else:
                held.append(observer)

    worker = Worker(
        config(topic, kafka_bootstrap, coordinator_url, group_id, max_buffered_bytes=bound),
        task=Holding,
    )
    async with running(worker):
        await until(lambda: worker.runtime is not None and worker.runtime.paused, 60, "a pause")
        runtime = worker.runtime
        assert runtime is not None
        await until(lambda: len(done) == 30, 30, "the first records handed out")
        buffered = runtime.buffered_bytes
        assert buffered > bound
        # More records arrive while paused: none of them is fetched.
        await produce_values(kafka_bootstrap, topic, 100, 2_000)
        grown: list[int] = []

        def sample() -> bool:
            if runtime.buffered_bytes > buffered:
                grown.append(runtime.buffered_bytes)
            return False

        epoch = worker.consumer.member_epoch
        # Longer than the session (3 s): the membership lives on while fetching is paused.
        with pytest.raises(AssertionError):
            await until(sample, 4, "never: sampling the buffer while paused")
        assert grown == [] and len(done) == 30
        assert worker.consumer.member_epoch == epoch
        release.set()
        for observer in held:
            observer.success()
        await until(lambda: len(done) == 130, 60, "every record processed after the resume")
        await until(lambda: not runtime.paused, 30, "fetching resumed")
    assert runtime.pauses >= 1


async def test_a_handler_blocking_past_the_session_in_a_thread_does_not_starve_heartbeats(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS[:20])
    group_id = group()
    session_ms = 2_000
    calls: list[int] = []

    def handle(record: Any) -> None:
        calls.append(record.offset)
        if record.offset == 5:
            time.sleep(session_ms / 1000 * 2)

    lost: list[str] = []
    worker = Worker(
        config(topic, kafka_bootstrap, coordinator_url, group_id, session_timeout_ms=session_ms),
        handler=handle,
    )
    async with running(worker):
        await until(lambda: worker.consumer.member_epoch, 30, "joining")
        epoch = worker.consumer.member_epoch
        await until(lambda: 5 in calls, 30, "the blocking record to start")

        async def watch() -> None:
            while len(calls) < 20 or 5 in calls[-1:]:
                if worker.consumer.member_epoch != epoch:
                    lost.append(f"epoch {worker.consumer.member_epoch}")
                await asyncio.sleep(0.05)

        await asyncio.wait_for(watch(), 60)
        await until(all_committed(coordinator_url, group_id, topic, 20), 30, "all committed")
    assert lost == []
    # Every record ran once: a lost session would have redelivered the blocked one.
    assert sorted(calls) == list(range(20))


async def test_metrics_count_what_the_worker_did_on_the_optional_port(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS[:30])
    group_id = group()
    port = free_port()

    async def handle(record: Any) -> None:
        if record.offset == 7:
            raise ValueError("skip me")

    worker = Worker(
        config(
            topic,
            kafka_bootstrap,
            coordinator_url,
            group_id,
            failure_policy="skip",
            metrics_port=port,
        ),
        handler=handle,
    )
    async with running(worker), httpx.AsyncClient() as http:
        await until(lambda: worker.stats.processed == 29, 60, "every record processed")

        async def scraped() -> str:
            reply = await http.get(f"http://127.0.0.1:{port}/metrics")
            return reply.text if "keyrange_worker_slice_lag{" in reply.text else ""

        await until(scraped, 30, "the slice lag to be known")
        text = await scraped()
    assert "keyrange_worker_records_processed_total 29.0" in text
    assert "keyrange_worker_records_failed_total 1.0" in text
    assert "keyrange_worker_records_skipped_total 1.0" in text
    assert "keyrange_worker_in_flight 0.0" in text
    labels = f'key_end="{2**63 - 1}",key_start="0",partition="0",topic="{topic}"'
    assert f"keyrange_worker_slice_lag{{{labels}}} 0.0" in text
    # What the chart's dashboard reads of a worker is what it serves.
    assert problems(dashboard_queries(), text, "worker") == []


def test_metrics_without_prometheus_client_say_which_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(MetricsUnavailable, match=r"pip install 'keyrange\[worker\]'"):
        MetricsServer(0, list, asyncio.new_event_loop(), extra="worker")


async def test_a_plain_handler_runs_on_the_process_pool_with_acks_and_commits(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS[:40])
    group_id = group()
    journal = tmp_path / "journal"
    monkeypatch.setenv("WORKER_TEST_JOURNAL", str(journal))
    worker = Worker(
        config(
            topic, kafka_bootstrap, coordinator_url, group_id, processes=2, failure_policy="skip"
        ),
        handler=worker_targets.in_a_process,
    )
    async with running(worker):
        await until(all_committed(coordinator_url, group_id, topic, 40), 60, "all committed")
        assert worker.stats.skipped == 1
    lines = journal.read_text().split("\n")[:-1]
    assert sorted(int(line.split()[2]) for line in lines) == [o for o in range(40) if o != 3]
    assert str(os.getpid()) not in {line.split()[1] for line in lines}


async def test_a_pool_process_that_dies_fails_its_records_and_is_replaced(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS[:40])
    group_id = group()
    journal = tmp_path / "journal"
    monkeypatch.setenv("WORKER_TEST_JOURNAL", str(journal))
    settings = config(
        topic,
        kafka_bootstrap,
        coordinator_url,
        group_id,
        processes=2,
        failure_policy="retry",
        max_attempts=3,
        retry_backoff_s=0.01,
    )
    worker = Worker(settings, handler=worker_targets.dies_once)
    async with running(worker):
        await until(all_committed(coordinator_url, group_id, topic, 40), 60, "all committed")
        assert worker.stats.retried >= 1
    died = (tmp_path / "journal.died").read_text()
    lines = [line.split() for line in journal.read_text().split("\n")[:-1]]
    assert {int(line[2]) for line in lines} == set(range(40))
    # Offset 5 was tried again in the process that replaced the dead one.
    assert [line[1] for line in lines if line[2] == "5"] != [died]
    assert died not in {line[1] for line in lines if int(line[2]) > 5}
    # Per-key order held across the processes and the retry: the journal (appended to by
    # every process as each record finished) has each key's offsets in increasing order.
    by_key: dict[bytes, list[int]] = defaultdict(list)
    for line in lines:
        by_key[KEYS[int(line[2])]].append(int(line[2]))
    assert all(offsets == sorted(offsets) for offsets in by_key.values())
    assert by_key[KEYS[5]] == [o for o in range(40) if KEYS[o] == KEYS[5]]


async def test_records_larger_than_a_pipe_buffer_reach_the_pool_processes(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = await make_topic(1)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for index in range(5):
            await producer.send(topic, key=KEYS[index], value=bytes([index]) * 200_000)
        await producer.flush()
    finally:
        await producer.stop()
    group_id = group()
    journal = tmp_path / "journal"
    monkeypatch.setenv("WORKER_TEST_JOURNAL", str(journal))
    worker = Worker(
        config(topic, kafka_bootstrap, coordinator_url, group_id, processes=2),
        handler=worker_targets.dies_once,
    )
    async with running(worker):
        await until(all_committed(coordinator_url, group_id, topic, 5), 60, "all committed")
    lines = [line.split() for line in journal.read_text().split("\n")[:-1]]
    assert sorted((int(line[2]), int(line[3])) for line in lines) == [
        (offset, 200_000) for offset in range(5)
    ]


async def test_the_pool_reports_how_long_its_processes_waited_for_records(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS[:4])
    group_id = group()
    monkeypatch.setenv("WORKER_TEST_JOURNAL", str(tmp_path / "journal"))
    worker = Worker(
        config(topic, kafka_bootstrap, coordinator_url, group_id, processes=1),
        handler=worker_targets.dies_once,
    )
    async with running(worker):
        await until(all_committed(coordinator_url, group_id, topic, 4), 60, "first committed")
        # A gap with nothing to process: the process waits through it, and says so with
        # the outcomes of its next batch.
        await asyncio.sleep(0.5)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(topic, key=KEYS[4], value=b"v4")
        finally:
            await producer.stop()
        await until(all_committed(coordinator_url, group_id, topic, 5), 60, "all committed")
        assert worker.process_wait_s >= 0.5


def test_processes_need_a_plain_handler() -> None:
    settings = config("t", "b", "http://c", "g", processes=2)

    async def handle(record: Any) -> None:
        return None

    with pytest.raises(ValueError, match="processes needs a plain"):
        Worker(settings, handler=handle)
    with pytest.raises(ValueError, match="processes needs a plain"):
        Worker(settings, task=WorkerTask)


async def test_accept_holds_the_head_back_until_punctuate_opens_the_gate(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS[:20])
    group_id = group()
    refused: list[int] = []
    processed: list[tuple[int, int]] = []

    class Gated(WorkerTask):
        """Merges by time, say: waits for three punctuations before taking anything."""

        def init(self, subpartition: SubPartition, config: WorkerConfig) -> None:
            self.ticks = 0

        def accept(self, record: Any) -> bool:
            if self.ticks < 3:
                refused.append(record.offset)
                return False
            return True

        async def process(self, record: Any, observer: RecordObserver) -> None:
            processed.append((self.ticks, record.offset))
            observer.success()

        async def punctuate(self, now: float) -> None:
            self.ticks += 1

    worker = Worker(config(topic, kafka_bootstrap, coordinator_url, group_id), task=Gated)
    async with running(worker):
        await until(all_committed(coordinator_url, group_id, topic, 20), 60, "all committed")
    assert refused and refused[0] == 0
    assert all(ticks >= 3 for ticks, _ in processed)
    assert [offset for _, offset in processed] == list(range(20))


async def test_a_timed_out_async_handler_is_cancelled_and_its_key_goes_on(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS[:40])
    group_id = group()
    cancelled: list[int] = []
    handled: list[int] = []

    async def handle(record: Any) -> None:
        if record.offset == 0:
            try:
                await asyncio.sleep(600)
            except asyncio.CancelledError:
                cancelled.append(record.offset)
                raise
        handled.append(record.offset)

    worker = Worker(
        config(
            topic,
            kafka_bootstrap,
            coordinator_url,
            group_id,
            processing_timeout_s=1.0,
            failure_policy="skip",
            # One worker: it must live on after its call was interrupted.
            max_concurrency=1,
        ),
        handler=handle,
    )
    async with running(worker):
        await until(all_committed(coordinator_url, group_id, topic, 40), 60, "all committed")
    assert cancelled == [0]
    assert sorted(handled) == list(range(1, 40))


async def test_finished_records_are_not_kept(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    """Memory stays bounded by what is in processing: nothing of a finished record stays
    reachable (a processing-timeout entry, say, lives on until its deadline)."""
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS[:50])
    group_id = group()
    finished: list[weakref.ref[Any]] = []

    async def handle(record: Any) -> None:
        finished.append(weakref.ref(record))

    worker = Worker(config(topic, kafka_bootstrap, coordinator_url, group_id), handler=handle)
    async with running(worker):
        await until(all_committed(coordinator_url, group_id, topic, 50), 60, "all committed")
        gc.collect()
        assert [ref() for ref in finished if ref() is not None] == []


async def test_a_partitioner_out_of_its_range_stops_the_worker_with_a_clear_error(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS[:5])

    class OffByOne:
        def subpartition(self, record: Any, key_hash: int) -> int:
            return 4

        def count(self, tp: TopicPartition) -> int:
            return 4

    class Noting(WorkerTask):
        def process(self, record: Any, observer: RecordObserver) -> None:
            observer.success()

    worker = Worker(
        config(topic, kafka_bootstrap, coordinator_url, group()),
        task=Noting,
        partitioner=OffByOne(),
    )
    with pytest.raises(WorkerFailed, match="the partitioner gave sub-partition 4 of 4"):
        async with asyncio.timeout(60):
            await worker.run()
