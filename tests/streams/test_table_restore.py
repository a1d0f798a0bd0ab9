"""A source-topic table restores to the committed position (issue 46 item 6, review L4): the
instance taking a key range over restores the table only up to where its processing of the
table's topic starts, and reads the table's later records as input, in timestamp order with
the stream, as Kafka Streams does. The base code restored the table to the topic's end, so
a stream record replayed after the hand-off joined a table value later than itself."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiokafka.structs import TopicPartition

from client.protocol.committed import CommittedOffsets, Watermark
from client.protocol.keyspace import KeyRange, key_hash
from client.streams import JSON, STRING, StreamsApp
from client.streams.dsl import StreamsBuilder
from client.streams.internal import for_application
from client.streams.restore import RestoreProgress, Restorer
from client.streams.restoring import StoreRestore, restore_store
from client.streams.state import StateManager
from client.tracker import OffsetTracker
from tests.fixtures.services import MakeTopic
from tests.streams.harness import TopicReader, produce, running
from tests.streams.test_examples import config
from tests.streams.test_restore_failures import Changelog
from tests.waiting import until

FROM_10 = ((KeyRange.full(), 10),)


def enrich(users: str, clicks: str, enriched: str) -> StreamsBuilder:
    builder = StreamsBuilder()
    table = builder.table(users, key_serde=STRING, value_serde=JSON)
    builder.stream(clicks, key_serde=STRING, value_serde=JSON).join(
        table, lambda click, user: [click, user]
    ).to(enriched)
    return builder


async def test_a_click_replayed_after_a_hand_off_joins_the_user_as_of_its_time(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    users, clicks, enriched = await make_topic(1), await make_topic(1), await make_topic(1)
    builder = enrich(users, clicks, enriched)
    await produce(kafka_bootstrap, users, [(b"u", b'"old"', 1_000)])
    await produce(kafka_bootstrap, clicks, [(b"u", b"1", 1_100)])
    settings = {"max_task_idle_ms": 2_000}
    first = StreamsApp(
        builder.build(),
        config("handoff", kafka_bootstrap, coordinator_url, tmp_path / "a", **settings),
    )
    async with TopicReader(kafka_bootstrap, enriched) as reader:
        async with running(first):
            await until(lambda: reader.poll(), 30, "the first click joined")
        # Committed at the stop: both topics at offset 1. The user changes after the next
        # click, whose record is written later.
        await produce(kafka_bootstrap, users, [(b"u", b'"new"', 3_000)])
        await produce(kafka_bootstrap, clicks, [(b"u", b"2", 2_000)])
        # Another instance (a state directory of its own) takes the range over.
        second = StreamsApp(
            builder.build(),
            config("handoff", kafka_bootstrap, coordinator_url, tmp_path / "b", **settings),
        )
        async with running(second):

            async def joined_twice() -> bool:
                return len(await reader.poll()) >= 2

            await until(joined_twice, 30, "the second click joined")
            await produce(kafka_bootstrap, clicks, [(b"u", b"3", 4_000)])

            async def joined_thrice() -> bool:
                return len(await reader.poll()) >= 3

            await until(joined_thrice, 30, "the third click joined")
        joined = [json.loads(record.value) for record in reader.records]
    # Each click with the user as of its time; the table's later record was read as input.
    assert joined == [[1, "old"], [2, "old"], [3, "new"]]


def test_a_slice_starts_each_part_at_the_groups_watermark_or_its_own_progress() -> None:
    """A range merged from two owners' progress: each part's table records below its own
    watermark were processed (the consumer skips them), so each part restores to its own."""
    tp = TopicPartition("users", 0)
    tracker = OffsetTracker()
    state = CommittedOffsets(10, watermarks=[Watermark(KeyRange(0, 99), 30)])
    tracker.add_slice(tp, KeyRange(0, 199), position=10, committed=state)
    (progress,) = tracker.slices_of(tp)
    assert progress.starts(KeyRange(50, 150)) == [(KeyRange(50, 99), 30), (KeyRange(100, 150), 10)]
    assert progress.accept(20, 120) and progress.accept(40, 60)
    # Nothing processed yet: the pending offset 20 is the floor of both parts.
    assert progress.starts(KeyRange(0, 199)) == [(KeyRange(0, 99), 30), (KeyRange(100, 199), 20)]
    assert progress.starts(KeyRange(300, 400)) == []


def split_between(low: bytes, high: bytes) -> tuple[KeyRange, KeyRange]:
    """Two ranges covering every hash, ``low``'s key in the first, ``high``'s in the second."""
    first, second = sorted([(key_hash(low, 0), low), (key_hash(high, 0), high)])
    assert first[1] == low, "pick keys whose hashes are in this order"
    middle = (first[0] + second[0]) // 2
    return KeyRange(KeyRange.full().start, middle), KeyRange(middle + 1, KeyRange.full().end)


async def restore_users(
    bootstrap: str,
    users: str,
    starts: tuple[tuple[KeyRange, int], ...],
    state: StateManager,
    restorer: Restorer,
) -> RestoreProgress:
    topology = for_application(enrich(users, "clicks", "out").build().build(), "app")
    (store,) = topology.stores
    job = StoreRestore("0_0", "app", store, topology.stores[store], 0, KeyRange.full(), starts)
    progress = RestoreProgress(store, 0, [job.keys], 0)
    await restore_store(job, progress, restorer, state, lambda _: None)
    return progress


async def test_each_part_of_a_range_restores_up_to_its_own_start_in_one_pass(
    kafka_bootstrap: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    users = await make_topic(1)
    low, high = sorted([b"a", b"b"], key=lambda key: key_hash(key, 0))
    first, second = split_between(low, high)
    await produce(
        kafka_bootstrap,
        users,
        [(low, b'"1"', None), (high, b'"1"', None), (low, b'"2"', None), (high, b'"2"', None)],
    )
    # A tiny fetch size: the restore's end falls inside fetches and between batches.
    restorer = Restorer({"bootstrap_servers": kafka_bootstrap}, partition_fetch_bytes=1)
    await restorer.start()
    try:
        topology = for_application(enrich(users, "clicks", "out").build().build(), "app")
        state = StateManager(topology, tmp_path)
        progress = await restore_users(
            kafka_bootstrap, users, ((first, 2), (second, 4)), state, restorer
        )
    finally:
        await restorer.stop()
    backend = state.backend(progress.store, 0)
    # The low key's second value (offset 2) is its task's input, the high key's was processed.
    assert backend.get(low) == b'"1"' and backend.get(high) == b'"2"'
    assert progress.position == 2  # every record of the range below it is in the store


async def test_local_table_state_past_the_committed_position_is_restored_anew(
    tmp_path: Path,
) -> None:
    """A checkpoint (or a standby, or a range kept from a task split) at 50 while the task
    processes the topic from 10: the store may hold values of records 10 to 49, later than
    the stream records the task processes next, so the range is deleted and read from 0."""
    topology = for_application(enrich("users", "clicks", "out").build().build(), "app")
    (store,) = topology.stores
    state = StateManager(topology, tmp_path)
    state.backend(store, 0).put(b"u", b'"later"')
    state.hold(store, 0, KeyRange.full(), 50)
    changelog = Changelog(end=10)
    job = StoreRestore("0_0", "app", store, topology.stores[store], 0, KeyRange.full(), FROM_10)
    progress = RestoreProgress(store, 0, [job.keys], 0)
    await restore_store(job, progress, changelog, state, lambda _: None)
    assert changelog.starts == [0]
    assert state.backend(store, 0).get(b"u") is None
    assert progress.position == 10


async def test_a_log_start_past_the_committed_position_is_not_taken_for_local_state(
    tmp_path: Path,
) -> None:
    """The topic's records up to 20 are gone and processing starts at 10: there is nothing
    to restore, and the restore ends (it must not delete and restart for ever)."""
    topology = for_application(enrich("users", "clicks", "out").build().build(), "app")
    (store,) = topology.stores
    state = StateManager(topology, tmp_path)
    changelog = Changelog(log_start=20, end=30)
    job = StoreRestore("0_0", "app", store, topology.stores[store], 0, KeyRange.full(), FROM_10)
    progress = RestoreProgress(store, 0, [job.keys], 0)
    await asyncio.wait_for(restore_store(job, progress, changelog, state, lambda _: None), 10)
    assert changelog.starts == [0]
