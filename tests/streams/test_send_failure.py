"""Issue 27, item 5: sends that fail during a revocation. Before, the first closing task's
flush raised on the first failed delivery and forgot the others; the revocation went on, the
next closing task's flush found nothing left to wait for and marked its inputs, and the
release committed inputs whose outputs never reached Kafka: counts lost once the heir
restored, with nothing in the log. Now nothing processed since the failure is committed,
the failure is logged at ERROR naming the task, and the instance stops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaTimeoutError

from client.http import CoordinatorClient
from client.streams import INT64, STRING, Processor, SendFailed, StoreSpec, StreamsApp, Topology
from client.streams.config import StreamsConfig
from client.streams.restore import Restorer
from tests.fixtures.services import MakeTopic
from tests.streams.harness import TopicReader, accept_range_fetch, group_owners, increments, produce
from tests.waiting import until

COMMIT_LINE = "commit"
WORDS = [f"w{index}" for index in range(40)]


class Split(Processor):
    """Lines into words; the line ``commit`` asks for a commit instead (the interval is 30 s,
    Kafka Streams' own at-least-once default, so nothing else commits in this test)."""

    def process(self, key: Any, value: str | None) -> None:
        if value == COMMIT_LINE:
            self.context.commit()
            return
        for word in (value or "").split():
            self.context.forward(word, 1)


class Count(Processor):
    def process(self, key: str, value: int) -> None:
        counts = self.context.state_store("counts")
        count = (counts.get(key) or 0) + value
        counts.put(key, count)
        self.context.forward(key, count)


def topology(lines: str, words: str, counts: str) -> Topology:
    """The word count's two sub-topologies: a revocation closes two tasks per key range."""
    return (
        Topology()
        .add_source("lines", lines, key_serde=STRING, value_serde=STRING)
        .add_processor("split", Split, "lines")
        .add_sink("to-words", words, "split", key_serde=STRING, value_serde=INT64)
        .add_source("words", words, key_serde=STRING, value_serde=INT64)
        .add_processor("count", Count, "words")
        .add_state_store(StoreSpec("counts", STRING, INT64), "count")
        .add_sink("to-counts", counts, "count", key_serde=STRING, value_serde=INT64)
    )


class CutProducer(AIOKafkaProducer):
    """A real producer whose broker becomes unreachable at ``cut``: what it is given from
    then on never reaches Kafka, and fails when a flush waits for it, as aiokafka fails
    records it could not deliver within ``request_timeout_ms``."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.cut = False
        self._stranded: list[asyncio.Future[Any]] = []

    async def send_batch(self, batch: Any, topic: str, *, partition: int) -> asyncio.Future[Any]:
        if not self.cut:
            delivery: asyncio.Future[Any] = await super().send_batch(
                batch, topic, partition=partition
            )
            return delivery
        stranded: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._stranded.append(stranded)
        return stranded

    async def flush(self) -> None:
        stranded, self._stranded = self._stranded, []
        for delivery in stranded:
            delivery.set_exception(KafkaTimeoutError("broker unreachable: the batch expired"))
        await super().flush()


class CutApp(StreamsApp):
    def _connections(self) -> tuple[AIOKafkaProducer, Restorer]:
        self.producer = CutProducer(**self._kafka)
        return self.producer, Restorer(self._kafka)


def lines_of(start: int, count: int) -> list[str]:
    return [
        " ".join(WORDS[(index * 7 + step) % len(WORDS)] for step in range(5))
        for index in range(start, start + count)
    ]


async def committed(coordinator: str, group: str, topic: str) -> int:
    async with CoordinatorClient(coordinator) as client:
        state = await client.fetch_offsets(group, [topic])
    return max((entry.stable_offset for entry in state.values()), default=0)


async def settled(coordinator: str, group: str, members: int) -> bool:
    owners = await group_owners(coordinator, group)
    return len(owners) == members and all(owners)


async def test_sends_failing_during_a_revocation_commit_nothing_and_stop_the_instance(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    lines, words, counts = await make_topic(1), await make_topic(1), await make_topic(1)
    await accept_range_fetch(coordinator_url, lines, words)
    app_id = f"sendfail-{lines}"

    def config(state: str) -> StreamsConfig:
        return StreamsConfig(
            application_id=app_id,
            bootstrap_servers=kafka_bootstrap,
            coordinator_url=coordinator_url,
            state_dir=tmp_path / state,
            session_timeout_ms=6_000,
            commit_interval_ms=30_000,
            revoke_timeout_s=10,
            show_progress=False,
        )

    def encoded(texts: list[str]) -> list[tuple[bytes, bytes, None]]:
        return [(b"line", text.encode(), None) for text in texts]

    before, after = lines_of(0, 40), lines_of(40, 40)
    direct = [WORDS[index % len(WORDS)] for index in range(0, 120, 3)]
    truth = Counter(word for text in before + after for word in text.split()) + Counter(direct)
    first = CutApp(topology(lines, words, counts), config("a"))
    heir = StreamsApp(topology(lines, words, counts), config("b"))
    caplog.set_level(logging.ERROR, logger="client.streams")
    running_first = asyncio.create_task(first.run())
    running_heir: asyncio.Task[None] | None = None
    try:
        await produce(kafka_bootstrap, lines, encoded([*before, COMMIT_LINE]))
        words_before = sum(len(text.split()) for text in before)
        commit_lines = 1

        async def counted_before() -> bool:
            # The commit line may come before the words it split reached the count: ask
            # again until the counts' inputs are committed too.
            nonlocal commit_lines
            done = await committed(coordinator_url, app_id, lines) >= len(before) + 1 and (
                await committed(coordinator_url, app_id, words) >= words_before
            )
            if not done:
                await produce(kafka_bootstrap, lines, encoded([COMMIT_LINE]))
                commit_lines += 1
            return done

        await until(
            counted_before, 60, "the first instance committed the first counts", interval_s=0.5
        )
        # From here on its broker is unreachable: everything it sends fails, at its flushes.
        first.producer.cut = True
        await produce(kafka_bootstrap, lines, encoded(after))
        await produce(kafka_bootstrap, words, increments(direct))
        expected = sorted([len(before) + commit_lines + len(after), words_before + len(direct)])

        def processed_all() -> bool:
            return sorted(entry["records"] for entry in first.metrics().values()) == expected

        await until(processed_all, 60, "the first instance processed what it cannot send")
        # A second instance joins: the first revokes half of its keys, and its flushes fail.
        running_heir = asyncio.create_task(heir.run())

        async def revoked() -> bool:
            return running_first.done() or await settled(coordinator_url, app_id, 2)

        await until(revoked, 60, "the first instance's revocation")
        if not running_first.done():
            first.stop()
        await asyncio.wait({running_first}, timeout=60)
        async with TopicReader(kafka_bootstrap, counts) as sink:
            short: dict[str, tuple[int, int]] = {}

            async def heir_counted() -> bool:
                await sink.poll()
                latest = sink.latest()
                short.clear()
                short.update(
                    (word, (latest.get(word, 0), count))
                    for word, count in truth.items()
                    if latest.get(word, 0) < count
                )
                return not short

            try:
                await until(heir_counted, 60, "the heir counted every word")
            except AssertionError as timeout:
                raise AssertionError(f"counts lost (counted, true): {short}") from timeout
    finally:
        for app, task in ((first, running_first), (heir, running_heir)):
            if task is not None and not task.done():
                app.stop()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 60)
    # The instance whose sends failed said so, naming the task, and stopped with the error.
    failures = [r for r in caplog.records if r.getMessage().startswith("a send failed")]
    assert failures and all(getattr(r, "task", None) for r in failures)
    assert isinstance(running_first.exception(), SendFailed)
    # A fresh instance restores each word's last changelog value: none below the truth.
    async with TopicReader(kafka_bootstrap, f"{app_id}-counts-changelog") as changelog:
        await asyncio.wait_for(changelog.read_to_end(), 30)
        restored = changelog.latest()
    lost = {
        word: (restored.get(word, 0), count)
        for word, count in truth.items()
        if restored.get(word, 0) < count
    }
    assert not lost, lost
