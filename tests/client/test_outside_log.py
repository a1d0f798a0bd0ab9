"""A group's stored position outside the partition's log (the broker lost its data, or the
topic was recreated): the consumer warns, applies ``auto_offset_reset`` as Kafka's consumer
does on ``OFFSET_OUT_OF_RANGE``, and moves the stored state so its commits count again."""

from __future__ import annotations

import logging

import pytest
from aiokafka.structs import TopicPartition

from client import CoordinatorClient, KeyRange, KeyrangeConsumer, key_hash
from client.errors import NoOffsetForPartition, OffsetOutOfRange
from client.http import PartitionCommit
from client.protocol.committed import Watermark
from tests.client.test_consumer import LOWER, UPPER, consumer_for, group, produce, take
from tests.fixtures.services import MakeTopic
from tests.waiting import until

KEYS = [b"key-%d" % (i % 7) for i in range(30)]


async def _store_past_the_end(coordinator_url: str, group_id: str, topic: str) -> None:
    """What a broker restart leaves: the group's position at 2,000 on a log of 30 records."""
    async with CoordinatorClient(coordinator_url) as api:
        await api.commit(group_id, [PartitionCommit(topic, 0, offset=2_000)])


async def _stable_offset(coordinator_url: str, group_id: str, tp: TopicPartition) -> int | None:
    async with CoordinatorClient(coordinator_url) as api:
        state = (await api.fetch_offsets(group_id, [tp.topic])).get(tp)
    return None if state is None else state.stable_offset


async def test_a_position_past_the_log_end_is_reset_to_earliest_and_committed_again(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic, group_id = await make_topic(1), group()
    tp = TopicPartition(topic, 0)
    await produce(kafka_bootstrap, topic, KEYS)
    await _store_past_the_end(coordinator_url, group_id, topic)
    caplog.set_level(logging.WARNING, logger="client.log_reset")
    async with consumer_for(kafka_bootstrap, coordinator_url, group_id) as consumer:
        consumer.assign({tp: []})
        records = await take(consumer, len(KEYS))
        await consumer.commit()
    assert [record.offset for record in records] == list(range(len(KEYS)))
    assert await _stable_offset(coordinator_url, group_id, tp) == len(KEYS)
    warnings = [r for r in caplog.records if r.name == "client.log_reset"]
    assert len(warnings) == 1
    assert (warnings[0].group_id, warnings[0].topic, warnings[0].partition) == (group_id, topic, 0)
    assert (warnings[0].position, warnings[0].high_watermark) == (2_000, len(KEYS))


async def test_keys_taken_as_processed_past_the_end_are_caught_from_an_in_range_position(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    """The stable offset is 0, but the upper half's watermark claims records up to 2,000: a
    slice reading from 0 would skip every upper-half record of the log."""
    topic, group_id = await make_topic(1), group()
    tp = TopicPartition(topic, 0)
    await produce(kafka_bootstrap, topic, KEYS)
    async with CoordinatorClient(coordinator_url) as api:
        await api.commit(
            group_id, [PartitionCommit(topic, 0, watermarks=(Watermark(UPPER, 2_000),))]
        )
    async with consumer_for(kafka_bootstrap, coordinator_url, group_id) as consumer:
        consumer.assign({tp: []})
        records = await take(consumer, len(KEYS))
        await consumer.commit()
    assert sorted(record.offset for record in records) == list(range(len(KEYS)))
    assert await _stable_offset(coordinator_url, group_id, tp) == len(KEYS)


async def test_a_group_member_resets_under_its_own_member_id(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic, group_id = await make_topic(1), group()
    tp = TopicPartition(topic, 0)
    await produce(kafka_bootstrap, topic, KEYS)
    await _store_past_the_end(coordinator_url, group_id, topic)
    member = KeyrangeConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        coordinator_url=coordinator_url,
        group_id=group_id,
        auto_commit_interval_ms=None,
    )
    async with member:
        records = await take(member, len(KEYS))
        await member.commit()
    assert sorted(record.offset for record in records) == list(range(len(KEYS)))
    assert await _stable_offset(coordinator_url, group_id, tp) == len(KEYS)


async def test_latest_skips_the_old_records_and_reads_what_comes_next(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic, group_id = await make_topic(1), group()
    tp = TopicPartition(topic, 0)
    await produce(kafka_bootstrap, topic, KEYS)
    await _store_past_the_end(coordinator_url, group_id, topic)
    options = {"auto_offset_reset": "latest"}
    async with consumer_for(kafka_bootstrap, coordinator_url, group_id, **options) as consumer:
        consumer.assign({tp: []})

        async def reset_to_the_log_end() -> bool:
            assert await consumer.getmany(timeout_ms=100) == {}
            return await _stable_offset(coordinator_url, group_id, tp) == len(KEYS)

        await until(reset_to_the_log_end, 30, "the stored position reset to the log end")
        await produce(kafka_bootstrap, topic, [b"after-1", b"after-2"])
        records = await take(consumer, 2)
    assert [record.key for record in records] == [b"after-1", b"after-2"]


async def test_members_sharing_the_partition_both_read_their_keys_after_one_reset(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic, group_id = await make_topic(1), group()
    tp = TopicPartition(topic, 0)
    await produce(kafka_bootstrap, topic, KEYS)
    await _store_past_the_end(coordinator_url, group_id, topic)
    lower = consumer_for(kafka_bootstrap, coordinator_url, group_id)
    upper = consumer_for(kafka_bootstrap, coordinator_url, group_id)
    async with lower, upper:
        lower.assign({tp: [LOWER]})
        upper.assign({tp: [UPPER]})
        expected_lower = sum(1 for key in KEYS if _in(LOWER, key))
        taken = await take(lower, expected_lower) + await take(upper, len(KEYS) - expected_lower)
        await lower.commit()
        await upper.commit()
    assert sorted(record.offset for record in taken) == list(range(len(KEYS)))
    assert await _stable_offset(coordinator_url, group_id, tp) == len(KEYS)


async def test_none_raises_instead_of_skipping(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic, group_id = await make_topic(1), group()
    tp = TopicPartition(topic, 0)
    await produce(kafka_bootstrap, topic, KEYS)
    await _store_past_the_end(coordinator_url, group_id, topic)
    options = {"auto_offset_reset": "none"}
    async with consumer_for(kafka_bootstrap, coordinator_url, group_id, **options) as consumer:
        consumer.assign({tp: []})
        with pytest.raises(OffsetOutOfRange, match="past its log end"):
            await take(consumer, 1)
    assert await _stable_offset(coordinator_url, group_id, tp) == 2_000


async def test_none_without_a_committed_offset_raises(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = await make_topic(1)
    options = {"auto_offset_reset": "none"}
    caplog.set_level(logging.INFO, logger="client.membership")
    async with consumer_for(kafka_bootstrap, coordinator_url, group(), **options) as consumer:
        consumer.assign({TopicPartition(topic, 0): []})
        with pytest.raises(NoOffsetForPartition, match=topic):
            await take(consumer, 1)
    # Said once, as one line: retrying cannot help, so the reconciler does not loop on it.
    refusals = [r for r in caplog.records if r.name == "client.membership.reconcile"]
    assert [r.levelno for r in refusals] == [logging.ERROR], refusals
    assert refusals[0].exc_info is None


def _in(keys: KeyRange, key: bytes) -> bool:
    return keys.contains(key_hash(key, 0))


def test_an_unknown_reset_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="'none'"):
        KeyrangeConsumer(
            bootstrap_servers="127.0.0.1:1",
            coordinator_url="http://127.0.0.1:1",
            group_id="g",
            auto_offset_reset="smallest",
        )
