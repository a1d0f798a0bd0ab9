"""Prompt hand-offs as members meet them, with the real broker and coordinator: a joiner gets
its share, and an heir its predecessor's, long before a heartbeat interval has passed.

The coordinator here tells members a 20 s interval: without prompt hand-offs a join would
take effect only after up to two of them (the holder hears of it, then the joiner does).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

import httpx

from client import KeyRange, KeyrangeConsumer
from tests.fixtures.coordinator import MakeDatabase, RunningCoordinator
from tests.fixtures.services import MakeTopic
from tests.waiting import until

LONG_SESSION_MS = 60_000  # the coordinator tells a 20 s interval: a third of the session
PROMPTLY_S = 10.0


def covered(consumer: KeyrangeConsumer) -> int:
    return sum(keys.size for ranges in consumer.assignment().values() for keys in ranges)


async def test_a_joiner_and_then_an_heir_take_over_key_ranges_well_within_an_interval(
    make_migrated_database: MakeDatabase,
    start_coordinator: Callable[..., Awaitable[RunningCoordinator]],
    kafka_bootstrap: str,
    make_topic: MakeTopic,
) -> None:
    coordinator = await start_coordinator(
        await make_migrated_database(),
        kafka_bootstrap=kafka_bootstrap,
        heartbeat_interval_ms=20_000,
        session_timeout_max_ms=LONG_SESSION_MS,
    )
    await until(lambda: coordinator.app.state.membership_watch.listening, 10, "the watch")
    topic = await make_topic(1)
    async with httpx.AsyncClient(base_url=coordinator.url) as admin:
        reply = await admin.put(
            f"/v1/admin/topics/{topic}/config", json={"accept_range_fetch": True}
        )
        assert reply.status_code == 200, reply.text
    options = {
        "bootstrap_servers": kafka_bootstrap,
        "coordinator_url": coordinator.url,
        "group_id": f"handoff-{uuid.uuid4().hex[:8]}",
        "session_timeout_ms": LONG_SESSION_MS,
    }
    whole = KeyRange.full().size
    async with KeyrangeConsumer(topic, **options) as first:  # type: ignore[arg-type]
        await until(lambda: covered(first) == whole, 30, "the first member to own it all")
        # A wake cuts the waiting heartbeat short and a fresh one answers at once; the
        # membership goes on working after it.
        assert first._lifespan.membership is not None
        assert await asyncio.wait_for(first._lifespan.membership.refresh(), PROMPTLY_S)

        joined_at = time.monotonic()
        async with KeyrangeConsumer(topic, **options) as second:  # type: ignore[arg-type]
            await until(lambda: covered(second) > 0, PROMPTLY_S, "the joiner's share")
            join_took = time.monotonic() - joined_at
            assert 0 < covered(first) < whole
        left_at = time.monotonic()
        await until(lambda: covered(first) == whole, PROMPTLY_S, "the heir's share")
        leave_took = time.monotonic() - left_at

    assert join_took < PROMPTLY_S and leave_took < PROMPTLY_S
