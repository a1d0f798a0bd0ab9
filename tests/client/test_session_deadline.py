"""A member whose event loop was blocked past its session deadline decides the loss from its
own clock: nothing buffered is handed out, nothing is committed, handlers still running are
cancelled (unless asked not to), and after rejoining it processes what it is given again.

The event loop is blocked with a synchronous sleep, as a handler calling blocking code would
block it; the coordinator here shares that loop, so it stalls too and reaps the member after.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
from aiokafka.structs import TopicPartition

from client import CoordinatorClient, errors
from tests.client.test_consumer import produce
from tests.client.test_membership import Recorder, group, member
from tests.fixtures.services import MakeTopic

SESSION_TIMEOUT_MS = 600
BLOCKED_S = 2 * SESSION_TIMEOUT_MS / 1000


async def test_past_its_deadline_a_member_hands_out_and_commits_nothing_then_rejoins(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, [b"key-%d" % index for index in range(20)])
    listener = Recorder()
    group_id = group()
    async with member(
        topic,
        kafka_bootstrap,
        coordinator_url,
        group_id,
        listener,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        auto_commit_interval_ms=None,
    ) as consumer:
        await listener.wait_for("assigned")
        first_member = consumer.member_id
        batch = await consumer.getmany(timeout_ms=10_000, max_records=1)
        [first] = batch[TopicPartition(topic, 0)]
        assert consumer.still_owned(first)
        consumer.mark_processed(first)

        time.sleep(BLOCKED_S)  # noqa: ASYNC251 - the fault under test

        assert not consumer.still_owned(first)
        assert await consumer.getmany(timeout_ms=0) == {}
        # Refused (UnknownMemberId) while the loss is being handled, a no-op once the slices
        # were dropped: either way the mark made before the deadline never reaches the group.
        with contextlib.suppress(errors.UnknownMemberId):
            await consumer.commit()
        async with CoordinatorClient(coordinator_url) as api:
            assert await api.fetch_offsets(group_id, [topic]) == {}
        await listener.wait_for("lost")
        await listener.wait_for("assigned", 2)
        assert consumer.member_id not in (None, first_member)
        again = await consumer.getmany(timeout_ms=10_000, max_records=1)
        # Nothing was committed, so the new membership starts from the first record again.
        assert [record.offset for record in again[TopicPartition(topic, 0)]] == [first.offset]
        assert consumer.still_owned(again[TopicPartition(topic, 0)][0])


@pytest.mark.parametrize("cancel_on_loss", [True, False], ids=["cancelled", "left-to-finish"])
async def test_handlers_running_when_the_session_is_lost_are_cancelled_unless_asked_not_to(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, cancel_on_loss: bool
) -> None:
    topic = await make_topic(1)
    await produce(kafka_bootstrap, topic, [b"slow", b"blocking"])
    listener = Recorder()
    notes: list[str] = []
    slow_started = asyncio.Event()

    async def handle(record: Any) -> None:
        if any(note.startswith(f"{record.offset}:") for note in notes):
            notes.append(f"{record.offset}: again")
            return
        if record.offset == 0:
            notes.append("0: started")
            slow_started.set()
            try:
                await asyncio.sleep(BLOCKED_S + 1)
            except asyncio.CancelledError:
                notes.append("0: cancelled")
                raise
            notes.append("0: finished")
        else:
            await slow_started.wait()
            notes.append("1: blocking")
            time.sleep(BLOCKED_S)  # noqa: ASYNC251 - the fault under test

    async with member(
        topic,
        kafka_bootstrap,
        coordinator_url,
        group(),
        listener,
        session_timeout_ms=SESSION_TIMEOUT_MS,
    ) as consumer:
        running = asyncio.create_task(
            consumer.run(handle, max_concurrency=2, cancel_on_loss=cancel_on_loss)
        )
        outcome = "0: cancelled" if cancel_on_loss else "0: finished"
        async with asyncio.timeout(30):
            while not {outcome, "0: again", "1: again"} <= set(notes):
                assert not running.done(), running
                await asyncio.sleep(0.02)
        await consumer.stop()
        await running
    assert ("0: finished" in notes) is not cancel_on_loss
    assert ("0: cancelled" in notes) is cancel_on_loss
    kinds = [kind for kind, _ in listener.events]
    assert kinds[:2] == ["assigned", "lost"]
