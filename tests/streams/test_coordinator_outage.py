"""Issue 27, item 6: a coordinator outage shorter than the session does not stop a streams
instance. Before, the runtime's commit let every coordinator error out of the processing
loop: a coordinator restarted on the same port (down 1.4-2.4 s), or a connection reset for
a second, stopped the instance with exit 1. Now a commit that fails that way is tried again
with a backoff, processing goes on while the session holds, and only a lost membership stops
the tasks (the member rejoins)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from client.streams import StreamsApp
from client.streams.config import StreamsConfig
from coordinator.app import create_app
from tests.chaos.proxy import DROP, TcpProxy
from tests.fixtures.coordinator import RunningCoordinator, settings_for_tests
from tests.fixtures.services import MakeTopic
from tests.streams.harness import (
    TopicReader,
    accept_range_fetch,
    count_topology,
    increments,
    produce,
)
from tests.waiting import until

StartCoordinator = Callable[..., Awaitable[RunningCoordinator]]
WORDS = [f"w{index}" for index in range(20)]
# Well inside the 10 s session, restart included: the coordinator must not expire the member.
OUTAGE_S = 2.0


@pytest.mark.parametrize("outage", ["restart", "reset"])
async def test_a_coordinator_outage_shorter_than_the_session_does_not_stop_the_instance(
    start_coordinator: StartCoordinator,
    database_url: str,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    outage: str,
) -> None:
    coordinator = await start_coordinator(database_url, kafka_bootstrap=kafka_bootstrap)
    words, counts = await make_topic(1), await make_topic(1)
    await accept_range_fetch(coordinator.url, words)
    link = await TcpProxy([("127.0.0.1", coordinator.port)]).start()
    config = StreamsConfig(
        application_id=f"outage-{words}",
        bootstrap_servers=kafka_bootstrap,
        coordinator_url=coordinator.url if outage == "restart" else link.url,
        state_dir=tmp_path,
        session_timeout_ms=10_000,
        # A commit every 50 ms: several meet the outage.
        commit_interval_ms=50,
        show_progress=False,
    )
    caplog.set_level(logging.INFO)
    app = StreamsApp(count_topology(words, counts), config)
    running = asyncio.create_task(app.run())
    restarted: RunningCoordinator | None = None
    sent = WORDS * 3
    try:
        async with TopicReader(kafka_bootstrap, counts) as sink:

            async def counted() -> bool:
                await sink.poll()
                return sink.latest() == dict(Counter(sent))

            await produce(kafka_bootstrap, words, increments(WORDS * 3))
            await until(counted, 60, "the first words counted")
            if outage == "restart":
                assert urlsplit(config.coordinator_url).port == coordinator.port
                await coordinator.stop()
            else:
                link.cut(DROP)
            # Records keep coming during the outage; the instance processes them.
            for _ in range(4):
                await produce(kafka_bootstrap, words, increments(WORDS))
                sent += WORDS
                await asyncio.sleep(OUTAGE_S / 4)
            if outage == "restart":
                restarted = RunningCoordinator(
                    create_app(settings_for_tests(kafka_bootstrap=kafka_bootstrap), database_url),
                    port=coordinator.port,
                )
                await restarted.start()
            else:
                link.heal()
            await produce(kafka_bootstrap, words, increments(WORDS))
            sent += WORDS
            await until(counted, 60, "every word counted exactly, after the outage")

        def commits_again() -> bool:
            return any(r.getMessage() == "commit succeeded again" for r in caplog.records)

        await until(commits_again, 30, "a commit after the outage")
        assert not running.done(), running
        # The outage was shorter than the session: the membership held throughout.
        assert not [r for r in caplog.records if r.getMessage() == "slices lost"]
    finally:
        app.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 60)
        if restarted is not None:
            await restarted.stop()
        await link.stop()
    assert running.exception() is None
