"""A lost membership (the coordinator removed the member) while a pool thread is inside a
processor: the task takes no further record and is dropped only after the processor
returns, never under it."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from client.streams import STRING, Processor, StoreSpec, StreamsApp, Topology
from client.streams.config import StreamsConfig
from tests.fixtures.services import MakeTopic
from tests.streams.harness import accept_range_fetch, produce, running
from tests.waiting import until


class Blocking(Processor):
    """Holds its first record until released, and notes what ran when."""

    def __init__(self, events: list[str], entered: threading.Event, release: threading.Event):
        self._events = events
        self._entered = entered
        self._release = release

    def process(self, key: Any, value: Any) -> None:
        self._events.append("process")
        self.context.state_store("latest").put(key, value)
        self._entered.set()
        self._release.wait(60)
        self._events.append("processed")

    def close(self) -> None:
        self._events.append("close")


async def test_a_lost_membership_drops_a_task_only_after_its_processor_returns(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = await make_topic(1)
    await accept_range_fetch(coordinator_url, source)
    events: list[str] = []
    entered, release = threading.Event(), threading.Event()
    topology = (
        Topology()
        .add_source("in", source, key_serde=STRING, value_serde=STRING)
        .add_processor("hold", lambda: Blocking(events, entered, release), "in")
        .add_state_store(StoreSpec("latest", STRING, STRING), "hold")
    )
    app_id = f"lost-{source}"
    config = StreamsConfig(
        application_id=app_id,
        bootstrap_servers=kafka_bootstrap,
        coordinator_url=coordinator_url,
        state_dir=tmp_path,
        session_timeout_ms=3_000,
        processing_threads=2,
        show_progress=False,
    )
    # Two records of one key: the second, buffered behind the first, is not processed by the
    # lost task once the first returns.
    await produce(kafka_bootstrap, source, [(b"k", b"v1", None), (b"k", b"v2", None)])
    caplog.set_level(logging.WARNING, logger="client.consumer")
    app = StreamsApp(topology, config)
    async with running(app):
        try:
            await until(entered.is_set, 60, "the processor holds its record")
            async with httpx.AsyncClient(base_url=coordinator_url) as admin:
                removed = await admin.delete(f"/v1/admin/groups/{app_id}/members/{app.member_id}")
                assert removed.status_code == 200, removed.text

            def lost() -> bool:
                return any(record.getMessage() == "slices lost" for record in caplog.records)

            await until(lost, 30, "the instance knows its slices are lost")
            # The loss is known and its listener running: the task waits for its processor.
            assert events == ["process"]
            # Its keys may be another instance's now: a query is not answered from its store.
            assert not (await app.query("latest", "k")).local
            release.set()
            await until(lambda: "close" in events, 30, "the lost task closed")
            assert events[:3] == ["process", "processed", "close"]
        finally:
            release.set()


class Freezing(Processor):
    """Blocks the event loop past the session on its first record, as a stop-the-world pause
    or a processor doing blocking I/O on the loop would, and notes what ran when."""

    def __init__(self, events: list[str], freeze_s: float) -> None:
        self._events = events
        self._freeze_s = freeze_s

    def process(self, key: Any, value: Any) -> None:
        self._events.append(f"process {self.context.offset}")
        if len(self._events) == 1:
            time.sleep(self._freeze_s)

    def close(self) -> None:
        self._events.append("close")


async def test_a_member_frozen_past_its_session_processes_no_buffered_record(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """docs/design.md §5, the client half: once the session deadline passed, the coordinator
    may have given the keys to another member, so not one more of the records buffered before the
    freeze is processed (its store writes would race the new owner's) until the member has
    rejoined and been given the keys again."""
    source = await make_topic(1)
    await accept_range_fetch(coordinator_url, source)
    events: list[str] = []
    session_ms = 2_000
    topology = (
        Topology()
        .add_source("in", source, key_serde=STRING, value_serde=STRING)
        .add_processor("freeze", lambda: Freezing(events, session_ms / 1000 + 0.5), "in")
    )
    config = StreamsConfig(
        application_id=f"frozen-{source}",
        bootstrap_servers=kafka_bootstrap,
        coordinator_url=coordinator_url,
        state_dir=tmp_path,
        session_timeout_ms=session_ms,
        # No commit between the freeze and the next round: nothing else yields to the
        # heartbeat task there.
        commit_interval_ms=600_000,
        show_progress=False,
    )
    await produce(kafka_bootstrap, source, [(b"k", b"v%d" % n, None) for n in range(20)])
    async with running(StreamsApp(topology, config)):
        await until(lambda: "close" in events, 30, "the frozen task dropped")
        await until(
            lambda: events.count("process 0") == 2, 30, "the rejoined member's first record"
        )
    # The task took nothing after the freeze: the loss dropped it, and the member, given the
    # keys again, starts over from the last commit.
    assert events[:3] == ["process 0", "close", "process 0"], events[:6]
