"""Issue 27, item 4: a task whose membership was lost while a processor call ran sends nothing
of what that call produced. The call returns after the session deadline, when another
instance already owns the key and has counted on: its changelog write and its sink record
would land after the heir's and undo every count the heir made. On the code before the
ownership gate, the changelog and the sink read 1, 2, ... 22, then 7, and a fresh restore
gave 7 for a word produced 22 times."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from urllib.parse import urlsplit

from client.http import CoordinatorClient
from client.protocol.keyspace import KeyRange
from client.streams import INT64, StreamsApp
from client.streams.config import StreamsConfig
from client.streams.restore import RestoreProgress, Restorer
from client.streams.stores import MemoryStore
from tests.chaos.proxy import DROP, TcpProxy
from tests.fixtures.services import MakeTopic
from tests.streams.harness import (
    TopicReader,
    accept_range_fetch,
    count_topology,
    increments,
    produce,
)
from tests.waiting import until

WORD = "k"
# The run: the first instance had counted the word 6 times when its call blocked;
# 22 occurrences in all, the last 16 counted by the heir.
BEFORE_BLOCK = 6
TOTAL = 22


def ones(count: int) -> list[tuple[bytes, bytes, None]]:
    return increments([WORD] * count)


async def committed_through(coordinator: str, group: str, topic: str, offset: int) -> bool:
    async with CoordinatorClient(coordinator) as client:
        state = (await client.fetch_offsets(group, [topic])).values()
    return any(entry.stable_offset >= offset for entry in state)


async def test_a_call_that_returns_after_the_session_deadline_sends_nothing(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    words, counts = await make_topic(1), await make_topic(1)
    await accept_range_fetch(coordinator_url, words)
    app_id = f"late-{words}"
    entered, release = threading.Event(), threading.Event()

    def hold(key: str, count: int) -> None:
        if count == BEFORE_BLOCK + 1:
            entered.set()
            release.wait(60)

    address = urlsplit(coordinator_url)
    assert address.hostname is not None and address.port is not None
    link = await TcpProxy([(address.hostname, address.port)]).start()

    def config(coordinator: str, state: str, threads: int) -> StreamsConfig:
        return StreamsConfig(
            application_id=app_id,
            bootstrap_servers=kafka_bootstrap,
            coordinator_url=coordinator,
            state_dir=tmp_path / state,
            session_timeout_ms=3_000,
            commit_interval_ms=100,
            # A's call blocks a pool thread; its loop goes on and learns of the loss.
            processing_threads=threads,
            show_progress=False,
        )

    first = StreamsApp(count_topology(words, counts, hold), config(link.url, "a", 2))
    heir = StreamsApp(count_topology(words, counts), config(coordinator_url, "b", 1))
    running_first = asyncio.create_task(first.run())
    running_heir: asyncio.Task[None] | None = None
    try:
        await produce(kafka_bootstrap, words, ones(BEFORE_BLOCK))
        await until(
            lambda: committed_through(coordinator_url, app_id, words, BEFORE_BLOCK),
            60,
            "the first instance committed its first counts",
        )
        await produce(kafka_bootstrap, words, ones(1))
        await until(entered.is_set, 60, "the first instance's call holds the next record")
        # Its coordinator link goes down: its session runs out while the call is held.
        link.cut(DROP)
        running_heir = asyncio.create_task(heir.run())
        await produce(kafka_bootstrap, words, ones(TOTAL - BEFORE_BLOCK - 1))
        async with TopicReader(kafka_bootstrap, counts) as sink:

            async def heir_counted() -> bool:
                await sink.poll()
                # At least: a loss of the heir's own session on a loaded machine would count
                # some again (at-least-once), never fewer.
                counted = sink.latest().get(WORD)
                return counted is not None and counted >= TOTAL

            await until(heir_counted, 60, "the heir counted every occurrence")
        release.set()
        await until(
            lambda: first.runtime is not None and not first.runtime.tasks,
            30,
            "the first instance dropped its lost task",
        )
        link.heal()
    finally:
        release.set()
        link.heal()
        for app, task in ((first, running_first), (heir, running_heir)):
            if task is not None:
                app.stop()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 60)
        await link.stop()
    # Both stopped, so whatever either producer was given has been delivered.
    changelog = f"{app_id}-counts-changelog"
    for topic in (changelog, counts):
        async with TopicReader(kafka_bootstrap, topic) as reader:
            await asyncio.wait_for(reader.read_to_end(), 30)
            assert reader.latest().get(WORD, 0) >= TOTAL, [
                int.from_bytes(record.value, "big") for record in reader.records
            ]
    # What a fresh instance restores from the changelog.
    restorer = Restorer({"bootstrap_servers": kafka_bootstrap})
    await restorer.start()
    try:
        store = MemoryStore()
        await restorer.restore(changelog, RestoreProgress("counts", 0, [KeyRange.full()], 0), store)
    finally:
        await restorer.stop()
    assert INT64.deserialize(store.get(WORD.encode())) >= TOTAL
    assert running_first.exception() is None
