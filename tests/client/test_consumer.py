"""KeyrangeConsumer against the embedded broker and a real coordinator (standalone mode)."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable

import httpx
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition

from client import (
    CommittedOffsets,
    CoordinatorClient,
    KeyRange,
    KeyrangeConsumer,
    RebalanceListener,
    key_hash,
)
from client.http import Slices
from tests.fixtures.coordinator import MakeDatabase, RunningCoordinator
from tests.fixtures.services import MakeTopic
from tests.waiting import until

StartCoordinator = Callable[..., Awaitable[RunningCoordinator]]

LOWER, UPPER = KeyRange.full().split(2)


def group() -> str:
    return f"g-{uuid.uuid4().hex[:10]}"


async def produce(bootstrap: str, topic: str, keys: list[bytes | None], partition: int = 0) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for index, key in enumerate(keys):
            await producer.send(topic, value=b"v%d" % index, key=key, partition=partition)
        await producer.flush()
    finally:
        await producer.stop()


def consumer_for(
    bootstrap: str, coordinator: str, group_id: str, **options: object
) -> KeyrangeConsumer:
    return KeyrangeConsumer(
        bootstrap_servers=bootstrap,
        coordinator_url=coordinator,
        group_id=group_id,
        auto_commit_interval_ms=None,
        **options,  # type: ignore[arg-type]
    )


async def take(consumer: KeyrangeConsumer, count: int, *, mark: bool = True) -> list[object]:
    taken: list[object] = []
    async with asyncio.timeout(30):
        while len(taken) < count:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for record in records:
                    taken.append(record)
                    if mark:
                        consumer.mark_processed(record)
    return taken


KEYS = [b"key-%d" % (i % 23) for i in range(120)]


async def test_a_slice_owner_gets_exactly_its_keys_in_offset_order(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS)
    expected = [o for o, key in enumerate(KEYS) if LOWER.contains(key_hash(key, o))]
    assert 0 < len(expected) < len(KEYS)
    async with consumer_for(kafka_bootstrap, coordinator_url, group()) as consumer:
        consumer.assign({TopicPartition(topic, 0): [LOWER]})
        records = await take(consumer, len(expected))
        assert [r.offset for r in records] == expected  # type: ignore[attr-defined]
        assert await consumer.getmany(timeout_ms=300) == {}


async def test_null_keys_spread_by_offset_over_the_slices(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, [None] * 40)
    expected = [o for o in range(40) if UPPER.contains(key_hash(None, o))]
    async with consumer_for(kafka_bootstrap, coordinator_url, group()) as consumer:
        consumer.assign({TopicPartition(topic, 0): [UPPER]})
        records = await take(consumer, len(expected))
        assert [r.offset for r in records] == expected  # type: ignore[attr-defined]


async def test_a_restarted_consumer_skips_what_was_committed_even_out_of_order(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS)
    group_id = group()
    tp = TopicPartition(topic, 0)
    processed: set[int] = set()
    async with consumer_for(kafka_bootstrap, coordinator_url, group_id) as first:
        first.assign({tp: []})
        records = await take(first, len(KEYS), mark=False)
        random.Random(7).shuffle(records)
        for record in records[: len(records) // 2]:
            first.mark_processed(record)
            processed.add(record.offset)  # type: ignore[attr-defined]
        await first.commit()
    async with CoordinatorClient(coordinator_url) as api:
        committed = (await api.fetch_offsets(group_id, [topic]))[tp]
    assert all(committed.is_processed(o, key_hash(KEYS[o], o)) for o in processed)
    assert not any(
        committed.is_processed(o, key_hash(KEYS[o], o))
        for o in range(len(KEYS))
        if o not in processed
    )
    remaining = [o for o in range(len(KEYS)) if o not in processed]
    async with consumer_for(kafka_bootstrap, coordinator_url, group_id) as second:
        second.assign({tp: []})
        again = await take(second, len(remaining))
        assert [r.offset for r in again] == remaining  # type: ignore[attr-defined]
        await second.commit()
    async with CoordinatorClient(coordinator_url) as api:
        final = (await api.fetch_offsets(group_id, [topic]))[tp]
    assert final.stable_offset == len(KEYS)


async def test_two_slice_owners_of_one_partition_commit_without_overlap(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS)
    group_id = group()
    tp = TopicPartition(topic, 0)
    seen: list[int] = []
    for keys in (LOWER, UPPER):
        async with consumer_for(kafka_bootstrap, coordinator_url, group_id) as consumer:
            consumer.assign({tp: [keys]})
            count = sum(keys.contains(key_hash(k, o)) for o, k in enumerate(KEYS))
            seen += [r.offset for r in await take(consumer, count)]  # type: ignore[attr-defined]
            await consumer.commit()
    assert sorted(seen) == list(range(len(KEYS)))
    async with CoordinatorClient(coordinator_url) as api:
        committed = (await api.fetch_offsets(group_id, [topic]))[tp]
    assert committed.stable_offset == len(KEYS)
    assert committed.ranges == ()


async def test_async_for_marks_the_previous_record_when_the_next_is_requested(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, [b"a", b"b", b"c"])
    group_id = group()
    tp = TopicPartition(topic, 0)
    async with consumer_for(kafka_bootstrap, coordinator_url, group_id) as consumer:
        consumer.assign({tp: []})
        async with asyncio.timeout(30):
            async for record in consumer:
                if record.offset == 2:
                    break
        await consumer.commit()
    async with CoordinatorClient(coordinator_url) as api:
        committed = (await api.fetch_offsets(group_id, [topic]))[tp]
    assert committed.stable_offset == 2  # offset 2 was handed out, never marked


async def test_run_keeps_each_key_sequential_and_in_offset_order(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(2)
    for partition in (0, 1):
        await produce(kafka_bootstrap, topic, KEYS, partition=partition)
    order: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    busy: set[tuple[int, bytes]] = set()
    overlaps: list[tuple[int, bytes]] = []
    peak = 0
    done = asyncio.Event()
    rng = random.Random(3)

    async def handle(record: object) -> None:
        nonlocal peak
        ident = (record.partition, record.key)  # type: ignore[attr-defined]
        if ident in busy:
            overlaps.append(ident)
        busy.add(ident)
        peak = max(peak, len(busy))
        await asyncio.sleep(rng.random() / 500)
        order[ident].append(record.offset)  # type: ignore[attr-defined]
        busy.discard(ident)
        if sum(map(len, order.values())) == 2 * len(KEYS):
            done.set()

    async with consumer_for(kafka_bootstrap, coordinator_url, group()) as consumer:
        consumer.assign({TopicPartition(topic, 0): [], TopicPartition(topic, 1): []})
        runner = asyncio.create_task(consumer.run(handle, max_concurrency=8))
        async with asyncio.timeout(30):
            await done.wait()
        await consumer.stop()
        await runner
    assert not overlaps
    assert peak > 1
    for (partition, key), offsets in order.items():
        assert offsets == [o for o, k in enumerate(KEYS) if k == key], (partition, key)


async def test_run_raises_the_handler_error_and_leaves_its_record_unprocessed(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, [b"a", b"b", b"c", b"d"])
    group_id = group()
    tp = TopicPartition(topic, 0)

    async def handle(record: object) -> None:
        if record.offset == 2:  # type: ignore[attr-defined]
            raise RuntimeError("boom")

    async with consumer_for(kafka_bootstrap, coordinator_url, group_id) as consumer:
        consumer.assign({tp: []})
        with pytest.raises(RuntimeError, match="boom"):
            async with asyncio.timeout(30):
                await consumer.run(handle)
        await consumer.commit()
    async with CoordinatorClient(coordinator_url) as api:
        committed = (await api.fetch_offsets(group_id, [topic]))[tp]
    assert not committed.is_processed(2, key_hash(b"c", 2))
    assert committed.is_processed(1, key_hash(b"b", 1))


async def test_deserializers_apply_after_the_raw_key_is_hashed(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS[:30])
    expected = [o for o, key in enumerate(KEYS[:30]) if LOWER.contains(key_hash(key, o))]
    async with consumer_for(
        kafka_bootstrap,
        coordinator_url,
        group(),
        key_deserializer=bytes.decode,
        value_deserializer=bytes.decode,
    ) as consumer:
        consumer.assign({TopicPartition(topic, 0): [LOWER]})
        records = await take(consumer, len(expected))
    assert [r.offset for r in records] == expected  # type: ignore[attr-defined]
    assert all(isinstance(r.key, str) for r in records)  # type: ignore[attr-defined]


async def test_reassigning_commits_and_reports_the_dropped_slices(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS)
    tp = TopicPartition(topic, 0)
    events: list[tuple[str, Slices]] = []

    class Recorder(RebalanceListener):
        async def on_slices_assigned(self, slices: Slices) -> None:
            events.append(("assigned", slices))

        async def on_slices_revoked(self, slices: Slices) -> None:
            events.append(("revoked", slices))

    group_id = group()
    async with consumer_for(
        kafka_bootstrap, coordinator_url, group_id, rebalance_listener=Recorder()
    ) as consumer:
        consumer.assign({tp: []})
        assert await consumer.wait_for_assignment() == {tp: [KeyRange.full()]}
        await take(consumer, len(KEYS))
        consumer.assign({tp: [LOWER]})
        assert await consumer.wait_for_assignment() == {tp: [LOWER]}
        async with CoordinatorClient(coordinator_url) as api:
            committed = (await api.fetch_offsets(group_id, [topic]))[tp]
        assert committed.stable_offset == len(KEYS)
    assert events[:2] == [("assigned", {tp: [KeyRange.full()]}), ("revoked", {tp: [UPPER]})]


async def test_enough_uncommitted_ranges_trigger_a_commit_without_waiting(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS[:20])
    group_id = group()
    tp = TopicPartition(topic, 0)
    async with (
        consumer_for(kafka_bootstrap, coordinator_url, group_id, max_num_ranges_to_commit=3) as c,
        CoordinatorClient(coordinator_url) as api,
    ):
        c.assign({tp: []})
        records = await take(c, 20, mark=False)
        for record in records[1:6:2]:  # offsets 1, 3, 5: three IC ranges above offset 0
            c.mark_processed(record)
        committed: dict[TopicPartition, CommittedOffsets] = {}

        async def commit_landed() -> bool:  # the commit runs in the background
            committed.update(await api.fetch_offsets(group_id, [topic]))
            return tp in committed

        await until(commit_landed, 30, "the early commit to reach the coordinator")
    assert committed[tp].ranges == ((1, 1), (3, 3), (5, 5))


async def test_without_individual_commit_a_whole_partition_commits_a_classic_offset(
    kafka_bootstrap: str,
    make_migrated_database: MakeDatabase,
    start_coordinator: StartCoordinator,
    make_topic: MakeTopic,
) -> None:
    coordinator = await start_coordinator(
        await make_migrated_database(), accept_individual_commit=False
    )
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS[:10])
    group_id = group()
    tp = TopicPartition(topic, 0)
    async with consumer_for(kafka_bootstrap, coordinator.url, group_id) as consumer:
        consumer.assign({tp: []})
        records = await take(consumer, 10, mark=False)
        for record in records[:4] + records[6:]:
            consumer.mark_processed(record)
        await consumer.commit()
    async with CoordinatorClient(coordinator.url) as api:
        committed = (await api.fetch_offsets(group_id, [topic]))[tp]
    assert (committed.stable_offset, committed.ranges, committed.watermarks) == (4, (), ())


async def test_commits_keep_to_the_range_limit_the_coordinator_announces(
    kafka_bootstrap: str,
    make_migrated_database: MakeDatabase,
    start_coordinator: StartCoordinator,
    make_topic: MakeTopic,
) -> None:
    coordinator = await start_coordinator(await make_migrated_database(), max_ranges_per_request=2)
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS[:10])
    group_id = group()
    tp = TopicPartition(topic, 0)
    async with consumer_for(
        kafka_bootstrap, coordinator.url, group_id, commit_mode="ranges"
    ) as consumer:
        consumer.assign({tp: []})
        records = await take(consumer, 10, mark=False)
        for record in records[1:6:2]:  # offsets 1, 3, 5: three IC ranges, one over the limit
            consumer.mark_processed(record)
        await consumer.commit()
        await consumer.commit()
    async with CoordinatorClient(coordinator.url) as api:
        committed = (await api.fetch_offsets(group_id, [topic]))[tp]
    assert committed.ranges == ((1, 1), (3, 3), (5, 5))


async def test_a_revoked_range_is_released_only_after_its_handed_out_records_are_marked(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS)
    tp = TopicPartition(topic, 0)
    group_id = group()
    unmarked_at_revoke: list[int] = []
    upper: list[object] = []

    class Check(RebalanceListener):
        async def on_slices_revoked(self, slices: Slices) -> None:
            unmarked_at_revoke.append(sum(1 for r in upper if r not in marked))

    marked: list[object] = []
    async with consumer_for(
        kafka_bootstrap, coordinator_url, group_id, rebalance_listener=Check()
    ) as consumer:
        consumer.assign({tp: []})
        records = await take(consumer, len(KEYS), mark=False)
        upper += [r for r in records if UPPER.contains(key_hash(r.key, r.offset))]  # type: ignore[attr-defined]
        consumer.assign({tp: [LOWER]})

        async def finish_upper_later() -> None:
            await asyncio.sleep(0.3)
            for record in upper:
                marked.append(record)
                consumer.mark_processed(record)

        marking = asyncio.create_task(finish_upper_later())
        async with asyncio.timeout(30):
            assert await consumer.wait_for_assignment() == {tp: [LOWER]}
        await marking
    assert unmarked_at_revoke[0] == 0  # then stop() revokes LOWER too
    async with CoordinatorClient(coordinator_url) as api:
        committed = (await api.fetch_offsets(group_id, [topic]))[tp]
    assert all(committed.is_processed(r.offset, key_hash(r.key, r.offset)) for r in upper)  # type: ignore[attr-defined]


def test_importing_the_client_pulls_in_no_server_packages() -> None:
    probe = (
        "import sys, client, client.consumer, client.membership, client.tracker; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'fastapi', 'sqlalchemy', 'coordinator', 'starlette', 'asyncpg', 'pyspark'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


async def test_mark_all_processed_commits_batches_whole_mixed_or_out_of_order(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(2)
    await produce(kafka_bootstrap, topic, KEYS, partition=0)
    await produce(kafka_bootstrap, topic, KEYS, partition=1)
    group_id = group()
    first, second = TopicPartition(topic, 0), TopicPartition(topic, 1)
    by_partition: dict[TopicPartition, list[object]] = defaultdict(list)
    async with consumer_for(kafka_bootstrap, coordinator_url, group_id) as consumer:
        consumer.assign({first: [], second: []})
        async with asyncio.timeout(30):
            while sum(map(len, by_partition.values())) < 2 * len(KEYS):
                for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                    by_partition[tp] += records
        # Out of order and across partitions: the one-by-one path.
        mixed = by_partition[first][1::2] + by_partition[second][:10]
        random.Random(3).shuffle(mixed)
        consumer.mark_all_processed(iter(mixed))
        await consumer.commit()
        async with CoordinatorClient(coordinator_url) as api:
            partly = await api.fetch_offsets(group_id, [topic])
        assert partly[first].stable_offset == 0
        assert partly[first].ranges == tuple((o, o) for o in range(1, len(KEYS), 2))
        assert partly[second].stable_offset == 10
        # The rest of each partition in offset order: the bulk path.
        consumer.mark_all_processed(by_partition[first][0::2])
        consumer.mark_all_processed(by_partition[second][10:])
        consumer.mark_all_processed(by_partition[second])  # marked already: ignored
        await consumer.commit()
    async with CoordinatorClient(coordinator_url) as api:
        final = await api.fetch_offsets(group_id, [topic])
    assert [final[tp].stable_offset for tp in (first, second)] == [len(KEYS), len(KEYS)]
    assert final[first].ranges == final[second].ranges == ()


async def test_getmany_max_records_hands_out_every_record_once_in_order(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, KEYS)
    offsets: list[int] = []
    async with consumer_for(kafka_bootstrap, coordinator_url, group()) as consumer:
        consumer.assign({TopicPartition(topic, 0): []})
        async with asyncio.timeout(30):
            while len(offsets) < len(KEYS):
                for records in (await consumer.getmany(timeout_ms=500, max_records=7)).values():
                    assert len(records) <= 7
                    offsets += [r.offset for r in records]
    assert offsets == list(range(len(KEYS)))


async def test_mark_all_processed_marks_the_records_given_not_the_batch_they_resemble(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    """A getmany batch with one record swapped for another partition's record at the same
    offset must not be marked as the batch it resembles."""
    topic = await make_topic(2)
    await produce(kafka_bootstrap, topic, KEYS, partition=0)
    await produce(kafka_bootstrap, topic, KEYS, partition=1)
    group_id = group()
    first, second = TopicPartition(topic, 0), TopicPartition(topic, 1)
    batches: dict[TopicPartition, list[list[object]]] = defaultdict(list)
    async with consumer_for(kafka_bootstrap, coordinator_url, group_id) as consumer:
        consumer.assign({first: [], second: []})
        async with asyncio.timeout(30):
            while sum(len(b) for bs in batches.values() for b in bs) < 2 * len(KEYS):
                for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                    batches[tp].append(records)
        for records in batches[first]:
            consumer.mark_all_processed(records)
        forged = list(batches[second][0])
        forged[1] = batches[first][0][1]  # offset 1 of the other partition, marked already
        consumer.mark_all_processed(forged)
        for records in batches[second][1:]:
            consumer.mark_all_processed(records)
        await consumer.commit()
        async with CoordinatorClient(coordinator_url) as api:
            partly = await api.fetch_offsets(group_id, [topic])
        assert partly[first].stable_offset == len(KEYS)
        assert partly[second].stable_offset == 1
        consumer.mark_all_processed([batches[second][0][1]])
        await consumer.commit()
    async with CoordinatorClient(coordinator_url) as api:
        final = await api.fetch_offsets(group_id, [topic])
    assert final[second].stable_offset == len(KEYS)


async def test_a_member_without_a_client_id_is_named_by_its_host_and_process(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    """The admin API, the CLI and the console show a member's client id to find the process
    holding a slice; "-" found nothing."""
    topic = await make_topic(1)
    group_id = group()
    async with (
        KeyrangeConsumer(
            topic,
            bootstrap_servers=kafka_bootstrap,
            coordinator_url=coordinator_url,
            group_id=group_id,
        ) as consumer,
        httpx.AsyncClient(base_url=coordinator_url) as admin,
    ):
        await consumer.wait_for_assignment()
        described = (await admin.get(f"/v1/admin/groups/{group_id}")).json()
    (member,) = described["members"]
    assert member["client_id"] == f"{socket.gethostname()}-{os.getpid()}"
