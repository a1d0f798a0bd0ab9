"""The examples, end to end with the real broker and coordinator."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from client.streams import QueryAnswer, StreamsApp, Topology
from client.streams.config import StreamsConfig
from examples import streams_join, streams_windowed, streams_wordcount
from tests.fixtures.services import MakeTopic
from tests.streams.harness import TopicReader, accept_range_fetch, decode, produce, running
from tests.waiting import until

LINES = [
    "the quick brown fox",
    "jumps over the lazy dog",
    "the dog barks",
    "a fox runs",
] * 5


def config(
    app_id: str, bootstrap: str, coordinator: str, state: Path, **extra: object
) -> StreamsConfig:
    return StreamsConfig(
        application_id=app_id,
        bootstrap_servers=bootstrap,
        coordinator_url=coordinator,
        state_dir=state,
        commit_interval_ms=200,
        session_timeout_ms=3_000,
        show_progress=False,
        **extra,  # type: ignore[arg-type]
    )


@dataclass
class WordCount:
    """The word-count example on fresh topics, fed with ``LINES``: what the in-process tests
    run, and the counts it must reach."""

    topology: Topology
    lines: str
    counts: str
    truth: Counter[str]

    async def counted(self, reader: TopicReader) -> bool:
        await reader.poll()
        return reader.latest() == dict(self.truth)


async def fed_word_count(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic
) -> WordCount:
    lines, words, counts = await make_topic(1), await make_topic(1), await make_topic(1)
    await accept_range_fetch(coordinator_url, lines, words)
    env = {"WORDCOUNT_LINES": lines, "WORDCOUNT_WORDS": words, "WORDCOUNT_COUNTS": counts}
    with mock.patch.dict(os.environ, env):
        topology = streams_wordcount.build_topology()
    await produce(
        kafka_bootstrap, lines, [(b"l%d" % i, line.encode(), None) for i, line in enumerate(LINES)]
    )
    truth = Counter(word for line in LINES for word in line.split())
    return WordCount(topology, lines, counts, truth)


@pytest.mark.parametrize("threads", [1, 4])
async def test_word_count_counts_every_word_exactly(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, tmp_path: Path, threads: int
) -> None:
    wc = await fed_word_count(kafka_bootstrap, coordinator_url, make_topic)
    app = StreamsApp(
        wc.topology,
        config(
            f"wc-{wc.lines}", kafka_bootstrap, coordinator_url, tmp_path, processing_threads=threads
        ),
    )
    async with running(app), TopicReader(kafka_bootstrap, wc.counts) as reader:
        await until(lambda: wc.counted(reader), 60, "every word counted")
        answer = await app.query("counts", "fox")
        assert answer.local and answer.value == wc.truth["fox"]
    assert len(reader.records) == sum(wc.truth.values())


@pytest.mark.parametrize("threads", [1, 4])
async def test_the_join_equals_a_reference_computed_in_plain_python(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, tmp_path: Path, threads: int
) -> None:
    orders, customers, output = await make_topic(1), await make_topic(1), await make_topic(1)
    await accept_range_fetch(coordinator_url, orders, customers)
    env = {"JOIN_ORDERS": orders, "JOIN_CUSTOMERS": customers, "JOIN_OUTPUT": output}
    with mock.patch.dict(os.environ, env):
        topology = streams_join.build_topology()
    people = [(f"c{index}", version) for version in (1, 2) for index in range(30)]
    customer_records = [
        (name.encode(), json.dumps({"name": name, "version": version}).encode(), 1_000 + step)
        for step, (name, version) in enumerate(people)
    ]
    order_records = [
        (f"c{index % 36}".encode(), json.dumps({"id": index}).encode(), 5_000 + index)
        for index in range(120)
    ]
    await produce(kafka_bootstrap, customers, customer_records)
    await produce(kafka_bootstrap, orders, order_records)
    table: dict[str, object] = {}
    for key, value, _ in customer_records:
        table[key.decode()] = json.loads(value)
    reference = sorted(
        (json.loads(value)["id"], json.dumps(table.get(key.decode()), sort_keys=True))
        for key, value, _ in order_records
    )
    apps = [
        StreamsApp(
            topology,
            config(
                f"join-{orders}",
                kafka_bootstrap,
                coordinator_url,
                tmp_path / name,
                max_task_idle_ms=2_000,
                processing_threads=threads,
            ),
        )
        for name in ("a", "b")
    ]
    async with running(apps[0]), running(apps[1]), TopicReader(kafka_bootstrap, output) as reader:

        async def joined() -> bool:
            return len(await reader.poll()) >= len(order_records)

        await until(joined, 60, "every order joined")
        answers: list[QueryAnswer] = []

        async def one_owner() -> bool:
            answers[:] = [await app.query("customers", "c1") for app in apps]
            return sum(answer.local for answer in answers) == 1

        # A hand-off may be under way (no instance answers locally): wait for it to settle.
        await until(one_owner, 30, "one instance owning c1")
        local = [answer for answer in answers if answer.local]
        remote = [answer for answer in answers if not answer.local]
        assert [answer.value for answer in local] == [table["c1"]]
        owner = next(app for app, answer in zip(apps, answers, strict=True) if answer.local)
        assert [answer.owner for answer in remote] == [owner.member_id]
    result = sorted(
        (
            decode(record.value)["order"]["id"],
            json.dumps(decode(record.value)["customer"], sort_keys=True),
        )
        for record in reader.records
    )
    assert result == reference


async def test_the_windowed_count_emits_closed_windows_in_stream_time_order(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    clicks, windows = await make_topic(1), await make_topic(1)
    await accept_range_fetch(coordinator_url, clicks)
    env = {"WINDOW_INPUT": clicks, "WINDOW_OUTPUT": windows, "WINDOW_MS": "100"}
    with mock.patch.dict(os.environ, env):
        topology = streams_windowed.build_topology()
    timestamps = [5, 130, 40, 250, 120, 90, 260, 410, 305, 999]
    await produce(kafka_bootstrap, clicks, [(b"page", b"{}", stamp) for stamp in timestamps])
    app = StreamsApp(topology, config(f"win-{clicks}", kafka_bootstrap, coordinator_url, tmp_path))
    async with running(app), TopicReader(kafka_bootstrap, windows) as reader:

        async def emitted() -> bool:
            return len(await reader.poll()) >= 4

        await until(emitted, 60, "four closed windows")
    closed = [
        (decode(record.value)["start"], decode(record.value)["count"]) for record in reader.records
    ]
    # Late records (their window already emitted when they came) are dropped: 40, 120, 90, 305.
    assert closed == [(0, 1), (100, 1), (200, 2), (400, 1)]


async def test_a_restart_restores_from_its_checkpoint_not_the_whole_changelog(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    wc = await fed_word_count(kafka_bootstrap, coordinator_url, make_topic)
    settings = config(f"wc-{wc.lines}", kafka_bootstrap, coordinator_url, tmp_path)
    async with TopicReader(kafka_bootstrap, wc.counts) as reader:
        async with running(StreamsApp(wc.topology, settings)):
            await until(lambda: wc.counted(reader), 60, "every word counted")
        assert list((tmp_path / settings.application_id).glob("*/counts/*/checkpoint"))
        restarted = StreamsApp(wc.topology, settings)
        async with running(restarted):
            await produce(kafka_bootstrap, wc.lines, [(b"again", b"fox fox", None)])
            wc.truth.update(["fox", "fox"])
            await until(
                lambda: wc.counted(reader), 60, "the new words counted on the restored state"
            )
            restores = [
                entry
                for task in restarted.metrics().values()
                for entry in task["restore"]
                if entry["store"] == "counts"
            ]
    # The changelog holds one entry per counted word; the restart read none of them again.
    assert restores and all(entry["read"] == 0 for entry in restores)
