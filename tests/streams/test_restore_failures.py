"""A restore finishes or says why not (issue 46, item 5): a failed restore is an ERROR naming
the task, store and offsets, counted, and retried until the task runs; a changelog whose
start is gone is restored from its log start where what is gone was expired (a window
store's changelog) or where the log is a new one (past its end), and refused, loudly, where
live keys' values were deleted (a compacted changelog). The runtime is driven offline, its
restorer a fake of our own port (the embedded broker has no DeleteRecords, so Kafka's
OffsetOutOfRange below the log start cannot be made on it); the restorer's own side of it,
the log start and the give-up on a changelog that never answers, runs on the broker, and so
does a whole app whose changelog lacks a partition."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka.structs import TopicPartition

from client.protocol.keyspace import KeyRange, key_hash
from client.streams import INT64, STRING, StoreSpec, StreamsApp, restore, restoring
from client.streams.errors import ChangelogOutOfRange, StreamsError
from client.streams.metrics import streams_families
from client.streams.processor import Processor
from client.streams.restore import RestoreProgress, Restorer
from client.streams.runtime import StreamsRuntime
from client.streams.state import StateManager
from client.streams.stores import BytesStore
from client.streams.topology import BuiltTopology, Topology
from coordinator.kafka import ClusterMetadata
from tests.client.in_memory_source import InMemorySource
from tests.fixtures.services import MakeTopic
from tests.streams.harness import count_topology, increments, produce, running
from tests.streams.test_examples import config
from tests.streams.test_runtime_offline import WORDS, Producer
from tests.streams.test_task import Rec
from tests.waiting import until


class Changelog:
    """A changelog partition whose log starts at ``log_start`` and ends at ``end``: a restore
    from outside it raises what the restorer raises on Kafka's OffsetOutOfRange; the first
    ``failures`` restores fail as a broker error would. Records each start offset asked."""

    def __init__(self, *, log_start: int = 0, end: int = 20, failures: int = 0) -> None:
        self.log_start = log_start
        self.end = end
        self.failures = failures
        self.starts: list[int] = []

    async def restore(
        self,
        topic: str,
        progress: RestoreProgress,
        backend: BytesStore,
        on_progress: Callable[[RestoreProgress], None] = lambda _: None,
    ) -> RestoreProgress:
        self.starts.append(progress.start_offset)
        if self.failures:
            self.failures -= 1
            raise StreamsError(f"cannot restore from changelog {topic}[0]: broker gone")
        if not self.log_start <= progress.start_offset <= self.end:
            raise ChangelogOutOfRange(topic, 0, progress.start_offset, self.log_start)
        progress.position = progress.end_offset = self.end
        progress.done = True
        return progress


class Passing(Processor):
    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, value)


def windowed_topology() -> BuiltTopology:
    """A pass-through with a window store attached: its changelog expires by time."""
    return (
        Topology()
        .add_source("words", "words", key_serde=STRING, value_serde=INT64)
        .add_processor("pass", Passing, "words")
        .add_state_store(StoreSpec("windows", STRING, INT64, retention_ms=60_000), "pass")
        .add_sink("out", "counts", "pass", key_serde=STRING, value_serde=INT64)
        .build()
    )


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(restoring, "FIRST_BACKOFF_S", 0.01)
    monkeypatch.setattr(restoring, "MAX_BACKOFF_S", 0.02)


def runtime_of(
    topology: BuiltTopology, changelog: Changelog, state: StateManager, source: InMemorySource
) -> StreamsRuntime:
    async def commit() -> None:
        return None

    return StreamsRuntime(
        source,
        topology=topology,
        application_id="app",
        producer=Producer(),
        restorer=changelog,
        state=state,
        owned=lambda: [(WORDS, KeyRange.full(), 0)],
        commit=commit,
        commit_interval_s=60,
        max_idle_ms=0,
        max_buffered_bytes=1 << 20,
        processing_threads=1,
        on_restore=lambda _: None,
    )


async def run_words(
    topology: BuiltTopology, changelog: Changelog, state: StateManager
) -> tuple[StreamsRuntime, asyncio.Task[None]]:
    """The runtime owning all of WORDS, four words put in."""
    source = InMemorySource()
    runtime = runtime_of(topology, changelog, state, source)
    source.grant(WORDS)
    runtime.assigned({WORDS: [KeyRange.full()]})
    running = asyncio.create_task(runtime.run())
    for offset, (key, value, _) in enumerate(increments(["a", "b", "c", "d"])):
        record = Rec("words", offset, key, value, 1_000 + offset)
        source.items.put_nowait((WORDS, record, key_hash(key, offset)))
    return runtime, running


async def stop(runtime: StreamsRuntime, running: asyncio.Task[None]) -> None:
    await runtime.stopping(5)
    await asyncio.wait_for(running, 10)


def logged(caplog: pytest.LogCaptureFixture, message: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.getMessage() == message]


async def test_a_failed_restore_is_an_error_counted_and_retried_until_the_task_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The base code left the restore's exception in its asyncio task: no log, no metric,
    and a task RESTORING for good while its records filled the byte budget."""
    topology = count_topology("words", "counts").build()
    changelog = Changelog(failures=2)
    runtime, running = await run_words(topology, changelog, StateManager(topology, None))
    task = next(iter(runtime.tasks))
    await until(lambda: task.metrics.records == 4, 10, "the task ran after two failed restores")
    errors = logged(caplog, "store restore failed; retried")
    assert [record.levelno for record in errors] == [logging.ERROR] * 2
    first = errors[0].__dict__
    assert (first["task"], first["store"], first["changelog"]) == (
        str(task.id),
        "counts",
        "app-counts-changelog",
    )
    assert (first["start_offset"], first["failures"]) == (0, 1)
    assert "broker gone" in first["error"]
    (progress,) = runtime.restores[task.id]
    assert (progress.failures, progress.error, progress.done) == (2, None, True)
    assert changelog.starts == [0, 0, 0]
    await stop(runtime, running)


class DiskErrorOnce(StateManager):
    """Deleting the range's stale local keys before a restore from 0 fails once, as a full
    or failing disk makes it."""

    def __init__(self, topology: BuiltTopology) -> None:
        super().__init__(topology, None)
        self.refusals = 1

    def restore_from(self, store: str, partition: int, keys: KeyRange) -> int:
        if self.refusals:
            self.refusals -= 1
            raise OSError(28, "No space left on device")
        return super().restore_from(store, partition, keys)


async def test_a_store_failing_before_its_restore_reads_is_retried_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    topology = count_topology("words", "counts").build()
    runtime, running = await run_words(topology, Changelog(), DiskErrorOnce(topology))
    task = next(iter(runtime.tasks))
    await until(lambda: task.metrics.records == 4, 10, "the task ran after the disk error")
    (error,) = logged(caplog, "store restore failed; retried")
    assert "No space left on device" in error.__dict__["error"]
    assert runtime.restores[task.id][0].failures == 1
    await stop(runtime, running)


async def test_a_window_changelog_whose_start_expired_restores_from_its_log_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    topology = windowed_topology()
    changelog = Changelog(log_start=10)
    runtime, running = await run_words(topology, changelog, StateManager(topology, None))
    task = next(iter(runtime.tasks))
    await until(lambda: task.metrics.records == 4, 10, "the task ran, restored from offset 10")
    assert changelog.starts == [0, 10]
    (warning,) = logged(
        caplog,
        "changelog offset outside its log: the range's local state is deleted and restored "
        "from the log start",
    )
    assert warning.levelno == logging.WARNING
    assert (warning.__dict__["offset"], warning.__dict__["log_start"]) == (0, 10)
    assert runtime.restores[task.id][0].failures == 0
    await stop(runtime, running)


async def test_a_compacted_changelog_that_lost_its_start_is_refused_loudly_not_restored_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    topology = count_topology("words", "counts").build()
    changelog = Changelog(log_start=10)
    runtime, running = await run_words(topology, changelog, StateManager(topology, None))
    task = next(iter(runtime.tasks))
    await until(lambda: len(changelog.starts) >= 3, 10, "the restore tried again")
    (progress,) = runtime.restores[task.id]
    assert progress.failures >= 2 and not progress.done
    assert progress.error is not None and "offset 0 is below its log start" in progress.error
    assert task.metrics.records == 0
    errors = logged(caplog, "store restore failed; retried")
    assert errors and errors[0].levelno == logging.ERROR
    assert "log start 10" in errors[0].__dict__["error"]
    await stop(runtime, running)


async def test_a_checkpoint_past_the_changelogs_end_restores_the_range_anew() -> None:
    """The changelog was created again: the range's local keys are of the old log, so they
    are deleted and the range is read from the new log's start, whatever the policy."""
    topology = count_topology("words", "counts").build()
    state = StateManager(topology, None)
    state.backend("counts", 0).put(b"\x00\x00\x00\x01stale", b"1")
    state.hold("counts", 0, KeyRange.full(), 50)
    changelog = Changelog(log_start=0, end=20)
    runtime, running = await run_words(topology, changelog, state)
    task = next(iter(runtime.tasks))
    await until(lambda: task.metrics.records == 4, 10, "the task ran on the new log")
    assert changelog.starts == [50, 0]
    assert state.backend("counts", 0).get(b"\x00\x00\x00\x01stale") is None
    await stop(runtime, running)


async def test_the_restorer_reads_a_changelogs_log_start(
    kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    changelog = await make_topic(1, config={"cleanup.policy": "delete"})
    await produce(kafka_bootstrap, changelog, increments(["a", "b", "c"]))
    restorer = Restorer({"bootstrap_servers": kafka_bootstrap})
    await restorer.start()
    try:
        assert await restorer.log_start(TopicPartition(changelog, 0)) == 0
    finally:
        await restorer.stop()


async def test_a_changelog_without_a_leader_fails_the_restore_after_a_while_naming_it(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retriable errors are retried for a while, then the restore fails (and the task's
    restore says so at ERROR and tries again) rather than retrying at INFO for ever."""
    monkeypatch.setattr(restore, "RETRIES_FOR_S", 0.5)
    restorer = Restorer({"bootstrap_servers": kafka_bootstrap})
    await restorer.start()
    try:
        progress = RestoreProgress("s", 7, [KeyRange.full()], 0)
        store = StateManager(count_topology("w", "c").build(), None).backend("counts", 7)
        with pytest.raises(StreamsError, match=r"changelog .*\[7\]: .*for over 0.5 s"):
            await asyncio.wait_for(restorer.restore("words-restore-none", progress, store), 20)
    finally:
        await restorer.stop()


class BrokenInit(Processor):
    def init(self, context: Any) -> None:
        raise RuntimeError("no connection to the enrichment service")

    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, value)


async def test_processors_failing_to_start_after_the_restore_are_an_error_not_silence(
    caplog: pytest.LogCaptureFixture,
) -> None:
    topology = (
        Topology()
        .add_source("words", "words", key_serde=STRING, value_serde=INT64)
        .add_processor("broken", BrokenInit, "words")
        .add_sink("out", "counts", "broken", key_serde=STRING, value_serde=INT64)
        .build()
    )
    runtime, running = await run_words(topology, Changelog(), StateManager(topology, None))
    await until(
        lambda: logged(caplog, "task not started after its restore"), 10, "the failure logged"
    )
    (error,) = logged(caplog, "task not started after its restore")
    assert error.levelno == logging.ERROR and error.exc_info is not None
    assert "enrichment service" in str(error.exc_info[1])
    await stop(runtime, running)


async def test_an_app_whose_changelog_lacks_a_partition_says_so_in_its_logs_and_metrics(
    kafka_bootstrap: str,
    coordinator_url: str,
    cluster_metadata: ClusterMetadata,
    make_topic: MakeTopic,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On a real broker: the changelog was created by hand with one partition for an input
    of two, so partition 1's restore never finds its changelog partition. The base code
    retried that at INFO for ever, the task RESTORING with no word of why; now the restore
    fails after a while, at ERROR, and the failures show in ``app.metrics()`` and on the
    metrics port, while partition 0 is counted."""
    monkeypatch.setattr(restore, "RETRIES_FOR_S", 0.5)
    words, counts = await make_topic(2), await make_topic(1)
    app_id = f"short-changelog-{words}"
    await cluster_metadata.create_topic(
        f"{app_id}-counts-changelog", 1, config={"cleanup.policy": "compact"}
    )
    await produce(kafka_bootstrap, words, increments([f"w{n}" for n in range(40)]))
    app = StreamsApp(
        count_topology(words, counts), config(app_id, kafka_bootstrap, coordinator_url, tmp_path)
    )

    def failing() -> list[tuple[str, dict[str, Any]]]:
        return [
            (task, restore)
            for task, figures in app.metrics().items()
            for restore in figures["restore"]
            if restore["failures"] >= 2
        ]

    async with running(app):
        await until(failing, 60, "partition 1's restore failing, twice")
        ((task, figures),) = failing()
        assert task.startswith("0_1") and not app.metrics()[task]["ready"]
        assert "[1]: no leader known, for over 0.5 s" in figures["error"]
        await until(
            lambda: any(f["records"] for t, f in app.metrics().items() if t.startswith("0_0")),
            60,
            "partition 0 counted meanwhile",
        )
        families = {family.name: family for family in streams_families(app.metrics())}
        failures = dict(families["keyrange_streams_restore_failures"].samples)
        assert failures[(task, "counts")] >= 2
    errors = [
        record
        for record in logged(caplog, "store restore failed; retried")
        if record.__dict__["task"] == task
    ]
    assert errors and all(record.levelno == logging.ERROR for record in errors)
    assert errors[0].__dict__["changelog"] == f"{app_id}-counts-changelog"
