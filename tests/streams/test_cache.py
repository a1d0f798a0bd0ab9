"""The record cache (``client.streams.cache``, docs/streams.md "The record cache"): one write
per key per commit to the store and its changelog, reads through the cache, eviction on the
process's budget, the commit's flush ahead of the producer flush and the offsets, DSL
aggregations forwarding one change per key per commit, and, end to end, a crash before the
commit losing nothing and a restore equal to the reference."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from aiokafka.structs import TopicPartition

from client.protocol.keyspace import KeyRange, key_hash
from client.streams import INT64, STRING, StoreSpec
from client.streams.cache import ENTRY_OVERHEAD, CacheBudget
from client.streams.config import StreamsConfig
from client.streams.dsl import StreamsBuilder
from client.streams.runtime import StreamsRuntime
from client.streams.state import StateManager
from client.streams.stores import MemoryStore, TaskStore
from client.streams.task import StreamTask, TaskId
from tests.client.in_memory_source import InMemorySource
from tests.fixtures.services import MakeTopic
from tests.streams.harness import (
    ROOT,
    WORDCOUNT_TARGET,
    StreamsProcess,
    TopicReader,
    batch,
    count_topology,
    decode,
    increments,
    produce,
    streams_command,
    truth_of,
    wordcount_topics,
)
from tests.streams.test_runtime_offline import Producer, Restorer
from tests.streams.test_task import Rec
from tests.waiting import until

FULL = KeyRange.full()
SPEC = StoreSpec("counts", STRING, INT64)
WORDS = TopicPartition("words", 0)


def cached_store(
    max_bytes: int, budget: CacheBudget | None = None
) -> tuple[TaskStore, MemoryStore, list[tuple[bytes, bytes | None]]]:
    backend = MemoryStore()
    changelog: list[tuple[bytes, bytes | None]] = []
    store = TaskStore(
        SPEC,
        backend,
        [FULL],
        lambda key, value: changelog.append((key, value)),
        budget or CacheBudget(max_bytes),
    )
    return store, backend, changelog


def entry_size(key: str) -> int:
    return len(key.encode()) + 8 + ENTRY_OVERHEAD


def test_a_scan_reads_the_cache_over_the_store_in_key_order_as_it_goes() -> None:
    store, backend, _ = cached_store(1 << 20)
    for key in ("a", "b", "c"):
        store.put(key, 1)
    store.flush_cache()
    store.put("b", 2)
    store.delete("c")
    store.put("0", 3)
    assert [key for key, _ in backend.scan()] == [b"a", b"b", b"c"]
    assert store.all() == [("0", 3), ("a", 1), ("b", 2)]
    assert store.range("a", "c") == [("a", 1), ("b", 2)]
    scan = store.scan()
    assert next(scan) == ("0", 3)
    assert list(scan) == [("a", 1), ("b", 2)]


def test_updates_wait_in_the_cache_and_leave_it_once_per_key_at_the_flush() -> None:
    store, backend, changelog = cached_store(1 << 20)
    for count in range(1, 6):
        store.put("a", count)
    store.put("b", 1)
    store.put("c", 1)
    store.delete("c")
    # Nothing written yet, and every read sees the cache: get, range and all alike.
    assert changelog == [] and list(backend.scan()) == []
    assert store.get("a") == 5 and store.get("c") is None
    assert store.all() == [("a", 5), ("b", 1)]
    assert store.range("a", "a") == [("a", 5)]

    assert store.flush_cache() == 3
    # One changelog record per key, the last value, in the order of the keys' last change.
    assert changelog == [
        (b"a", (5).to_bytes(8, "big")),
        (b"b", (1).to_bytes(8, "big")),
        (b"c", None),
    ]
    assert dict(backend.scan()) == {b"a": (5).to_bytes(8, "big"), b"b": (1).to_bytes(8, "big")}
    assert store.flush_cache() == 0


def test_a_full_cache_evicts_its_oldest_entries_to_the_store_and_changelog() -> None:
    # Room for two entries of these keys, not three.
    store, backend, changelog = cached_store(2 * entry_size("k0") + 4)
    store.put("k0", 1)
    store.put("k1", 1)
    store.put("k0", 2)  # k0 becomes the newest: k1 is now the oldest
    assert changelog == []
    store.put("k2", 1)
    assert changelog == [(b"k1", (1).to_bytes(8, "big"))]
    assert backend.get(b"k1") == (1).to_bytes(8, "big")
    assert store.get("k0") == 2 and store.get("k1") == 1 and store.get("k2") == 1
    assert store.cache is not None and store.cache.size_bytes <= 2 * entry_size("k0") + 4


def test_the_budget_is_the_process_s_and_a_write_evicts_from_its_own_store() -> None:
    budget = CacheBudget(2 * entry_size("k0"))
    first, _, first_log = cached_store(0, budget)
    second, _, second_log = cached_store(0, budget)
    first.put("k0", 1)
    first.put("k1", 1)
    assert budget.used == 2 * entry_size("k0")
    second.put("k2", 1)
    # Over the shared budget: the store written evicts its own entries, as in Kafka Streams.
    assert first_log == [] and second_log == [(b"k2", (1).to_bytes(8, "big"))]
    assert budget.used == 2 * entry_size("k0")
    first.flush_cache()
    assert budget.used == 0


def dsl_count_task(cache: CacheBudget | None) -> StreamTask:
    builder = StreamsBuilder()
    (
        builder.stream("words", key_serde=STRING, value_serde=STRING)
        .group_by_key()
        .count(store="counts", persistent=False)
        .to_stream()
        .to("counts", key_serde=STRING, value_serde=INT64)
    )
    built = builder.build().build()
    sub = built.subtopologies[0]
    backends: dict[str, Any] = {name: MemoryStore() for name in sub.stores}
    task = StreamTask(TaskId(0, 0, FULL), built, sub, backends, "app", 0, cache)
    task.init()
    return task


def sink_records(task: StreamTask) -> list[tuple[str, int]]:
    return [
        (record.key.decode(), decode(record.value))
        for record in task.outgoing
        if record.changelog_of is None
    ]


@pytest.mark.parametrize("cached", [False, True])
def test_a_dsl_count_forwards_one_change_per_key_per_commit_with_the_cache(cached: bool) -> None:
    task = dsl_count_task(CacheBudget(1 << 20) if cached else None)
    words = ["a", "b", "a", "a", "b", "c"]
    for offset, word in enumerate(words):
        task.add("words", Rec("words", offset, word.encode(), b'"x"', 1_000 + offset))
    while task.process_next(0) is True:
        pass
    if not cached:
        assert sink_records(task) == [("a", 1), ("b", 1), ("a", 2), ("a", 3), ("b", 2), ("c", 1)]
        return
    assert sink_records(task) == []
    task.flush_caches()
    # Downstream sees each key's latest count once, as Kafka Streams' cached KTable does.
    assert sink_records(task) == [("a", 3), ("b", 2), ("c", 1)]
    changelog = [record.key for record in task.outgoing if record.changelog_of == "counts"]
    assert changelog == [b"a", b"b", b"c"]


async def test_a_commit_flushes_the_cache_before_the_offsets_it_commits() -> None:
    """At the moment the offsets are committed, the producer holds the changelog record of
    every key the committed records changed, with its latest count."""
    topology = count_topology("words", "counts").build()
    source, producer = InMemorySource(), Producer()
    seen_at_commit: list[tuple[list[int], dict[bytes, int]]] = []

    async def commit() -> None:
        changelog = {
            key: int.from_bytes(value or b"", "big")
            for topic, key, value in producer.sent
            if topic == "app-counts-changelog" and key is not None
        }
        seen_at_commit.append((list(source.marked), changelog))

    runtime = StreamsRuntime(
        source,
        topology=topology,
        application_id="app",
        producer=producer,
        restorer=Restorer(),
        state=StateManager(topology, None),
        owned=lambda: [(WORDS, FULL, 0)],
        commit=commit,
        commit_interval_s=60,
        max_idle_ms=0,
        max_buffered_bytes=1 << 20,
        processing_threads=1,
        cache_max_bytes=1 << 20,
        on_restore=lambda _: None,
    )
    source.grant(WORDS)
    runtime.assigned({WORDS: [FULL]})
    running = asyncio.create_task(runtime.run())
    words = ["a", "b", "a", "c", "a", "b"]
    for offset, (key, value, _) in enumerate(increments(words)):
        record = Rec("words", offset, key, value, 1_000 + offset)
        source.items.put_nowait((WORDS, record, key_hash(key, offset)))

    def counted() -> bool:
        return sum(1 for topic, _, _ in producer.sent if topic == "counts") == len(words)

    await until(counted, 10, "a count per word")
    # The processor forwarded every count; the store's writes are still in the cache.
    assert not any(topic == "app-counts-changelog" for topic, _, _ in producer.sent)

    await runtime.commit()
    assert seen_at_commit == [(list(range(len(words))), {b"a": 3, b"b": 2, b"c": 1})]
    assert sum(1 for topic, _, _ in producer.sent if topic == "app-counts-changelog") == 3

    await runtime.stopping(5)
    await asyncio.wait_for(running, 5)


def test_the_cache_setting_is_checked_and_on_by_default() -> None:
    settings = StreamsConfig(application_id="a", bootstrap_servers="b", coordinator_url="c")
    assert settings.cache_max_bytes == 10 * 1024 * 1024
    with pytest.raises(ValueError, match="cache_max_bytes"):
        StreamsConfig(
            application_id="a", bootstrap_servers="b", coordinator_url="c", cache_max_bytes=-1
        )


# ------------------------------------------------------------------ end to end


async def start_word_count(
    spawned: list[StreamsProcess],
    env: dict[str, str],
    app_id: str,
    bootstrap: str,
    coordinator: str,
    state: Path,
    commit_interval_ms: int,
) -> StreamsProcess:
    """The word-count example in its own process, with the record cache on (its default)
    and the commit interval given."""
    command = streams_command(WORDCOUNT_TARGET, app_id, bootstrap, coordinator, state)
    command[command.index("--commit-interval-ms") + 1] = str(commit_interval_ms)
    process = StreamsProcess(
        await asyncio.create_subprocess_exec(
            *command,
            cwd=ROOT,
            env={**os.environ, **env},
            stderr=asyncio.subprocess.PIPE,
        )
    )
    spawned.append(process)
    return process


async def test_a_crash_before_the_commit_loses_nothing_and_a_restore_equals_the_reference(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    spawned: list[StreamsProcess],
) -> None:
    lines, words, counts = await wordcount_topics(make_topic, coordinator_url)
    env = {"WORDCOUNT_LINES": lines, "WORDCOUNT_WORDS": words, "WORDCOUNT_COUNTS": counts}
    app_id = f"wc-cache-{lines}"
    changelog = f"{app_id}-counts-changelog"
    produced = batch(0, 60)
    truth = truth_of(produced)
    args = (app_id, kafka_bootstrap, coordinator_url)
    # No commit for ten minutes (longer than the test, however busy the machine): every
    # count goes out, every store write waits in the cache.
    first = await start_word_count(spawned, env, *args, tmp_path / "a", 600_000)
    await produce(kafka_bootstrap, lines, produced)
    async with TopicReader(kafka_bootstrap, counts) as reader:

        async def every_word_out() -> bool:
            return len(await reader.poll()) >= sum(truth.values())

        await until(every_word_out, 90, "a count out for every word")
        async with TopicReader(kafka_bootstrap, changelog) as logged:
            assert await logged.read_to_end() == []
        first.process.kill()
        await first.process.wait()
        seen_at_kill = len(reader.records)

        # The next instance processes every record again on a store that got none of the
        # cached writes: nothing lost, at least once. No offset was committed, so it reads
        # the words the first split from the lines and splits every line once more: each
        # word ends counted twice as often as it occurs. Waiting for that end (not for the
        # first time a count reaches the truth) leaves nothing unprocessed for the third
        # instance below, which must count only the line it is given.
        second = await start_word_count(spawned, env, *args, tmp_path / "b", 200)
        recounts: dict[str, int] = {}

        async def recounted() -> bool:
            await reader.poll()
            recounts.clear()
            recounts.update(
                {r.key.decode(): decode(r.value) for r in reader.records[seen_at_kill:]}
            )
            return recounts == {word: 2 * occurs for word, occurs in truth.items()}

        await until(recounted, 90, "every word counted again, twice as often as it occurs")

        async def logged_all() -> bool:
            await reader.poll()
            latest = {r.key.decode(): decode(r.value) for r in reader.records[seen_at_kill:]}
            async with TopicReader(kafka_bootstrap, changelog) as logged:
                entries = {r.key.decode(): decode(r.value) for r in await logged.read_to_end()}
            recounts.clear()
            recounts.update(latest)
            return entries == latest

        await until(logged_all, 30, "the latest counts in the changelog")
        assert await second.stop(signal.SIGTERM) == 0
        async with TopicReader(kafka_bootstrap, changelog) as logged:
            written = len(await logged.read_to_end())
        # One changelog record per key per commit, far fewer than the updates.
        assert written < sum(recounts.values())
        print(
            f"\nwords counted again after the kill: {sum(recounts.values()) - sum(truth.values())}"
        )

        # A fresh instance restores the store from the changelog alone: one more line counts
        # on from what the changelog holds.
        await start_word_count(spawned, env, *args, tmp_path / "c", 200)
        seen_at_restart = len(reader.records)
        await produce(kafka_bootstrap, lines, [(b"again", b"w0 w1", None)])

        async def counted_on() -> bool:
            await reader.poll()
            latest = {r.key.decode(): decode(r.value) for r in reader.records[seen_at_restart:]}
            return latest == {"w0": recounts["w0"] + 1, "w1": recounts["w1"] + 1}

        await until(counted_on, 90, "the new words counted on the restored store")
