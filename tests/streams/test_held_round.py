"""Issue 46 item 2, streams half (review finding H2): a processing round still running past
``revoke_timeout_s`` when part of its task's range is revoked holds only the revoked part.
The kept range keeps its state (its task is split, not dropped and restored from offset 0)
and its records taken in meanwhile are processed and committed: every count ends exact."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from pathlib import Path

import pytest

from client.protocol.keyspace import KeyRange
from client.streams import StreamsApp
from client.streams.config import StreamsConfig
from tests.fixtures.services import MakeTopic
from tests.streams.harness import (
    TopicReader,
    accept_range_fetch,
    count_topology,
    increments,
    produce,
    running,
)
from tests.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.db]

WORDS = [f"w{index}" for index in range(24)]
STUCK = "w0"


async def test_a_stuck_round_holds_only_the_revoked_part_and_the_kept_range_keeps_its_state(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    words, counts = await make_topic(1), await make_topic(1)
    await accept_range_fetch(coordinator_url, words)
    entered, release = threading.Event(), threading.Event()
    holding = threading.Event()

    def hold(key: str, count: int) -> None:
        # The first instance's processor, on a processing thread, stuck on one word.
        if holding.is_set() and key == STUCK and not release.is_set():
            entered.set()
            release.wait(60)

    def app(name: str, stuck: bool) -> StreamsApp:
        config = StreamsConfig(
            application_id=f"held-{words}",
            bootstrap_servers=kafka_bootstrap,
            coordinator_url=coordinator_url,
            state_dir=tmp_path / name,
            processing_threads=2,
            revoke_timeout_s=0.5,
            commit_interval_ms=200,
            show_progress=False,
        )
        return StreamsApp(count_topology(words, counts, hold if stuck else None), config)

    sent = increments(WORDS * 2)
    caplog.set_level(logging.INFO, logger="client")
    try:
        async with TopicReader(kafka_bootstrap, counts) as reader:

            async def exact() -> bool:
                await reader.poll()
                return reader.latest() == dict(Counter(w.decode() for w, _, _ in sent))

            async with running(app("first", stuck=True)):
                await produce(kafka_bootstrap, words, sent)
                await until(exact, 60, "the first words counted")
                holding.set()
                more = increments([STUCK, *WORDS])
                sent += more
                await produce(kafka_bootstrap, words, more)
                await until(entered.is_set, 30, "the round stuck on a processing thread")
                async with running(app("second", stuck=False)):

                    def split() -> bool:
                        return any(r.getMessage() == "slices released" for r in caplog.records)

                    await until(split, 60, "the partial revocation past the revoke timeout")
                    more = increments(WORDS)
                    sent += more
                    await produce(kafka_bootstrap, words, more)
                    release.set()
                    await until(exact, 90, "every count exact after the round ended")
    finally:
        release.set()
    full = KeyRange.full()
    whole = f"[{full.start:x}-{full.end:x}]"
    closed = [
        (getattr(r, "task", ""), getattr(r, "kept", None))
        for r in caplog.records
        if r.getMessage() == "task closed" and str(getattr(r, "task", "")).endswith(whole)
    ]
    # The task of the whole range was split: its kept range's keys were kept, not dropped.
    assert closed and closed[0][1] == 1, closed
