"""A consumer stopped while aiokafka's fetch routine is awaiting the fetches an assignment
change cancelled still stops (client/kafka_stop.py): the routine swallows that first
cancellation, and a plain ``stop()`` would wait for it for ever."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from client.kafka_stop import stop_consumer
from tests.fixtures.services import MakeTopic
from tests.waiting import until


async def test_a_stop_that_lands_while_cancelled_fetches_finish_still_stops(
    kafka_bootstrap: str, make_topic: MakeTopic, caplog: pytest.LogCaptureFixture
) -> None:
    topic = await make_topic(1)
    kafka = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
    await kafka.start()
    cancelled = asyncio.Event()

    async def fetch_slow_to_cancel() -> bool:
        """Stands in for a fetch whose cancellation takes a moment, so the routine is
        inside its suppressed await when the stop's cancellation arrives."""
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            await asyncio.sleep(0.5)
        return False

    kafka.assign([TopicPartition(topic, 0)])
    await until(lambda: kafka._fetcher._pending_tasks, 10, "the routine to fetch")
    kafka._fetcher._pending_tasks.add(asyncio.create_task(fetch_slow_to_cancel()))
    kafka.assign([])  # the routine wakes and cancels the pending fetches
    await until(cancelled.is_set, 10, "the routine to cancel the pending fetch")
    caplog.set_level(logging.WARNING, logger="client.kafka_stop")
    async with asyncio.timeout(30):
        await stop_consumer(kafka)
    assert kafka._fetcher._fetch_task.done()
    # The first cancellation was swallowed: the workaround, not luck, stopped it.
    assert any("ignored its stop" in r.getMessage() for r in caplog.records)
