"""The examples, end to end with the real broker and coordinator."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from unittest import mock

from client.streams import StreamsApp
from client.streams.config import StreamsConfig
from examples import streams_wordcount
from tests.fixtures.services import MakeTopic
from tests.streams.harness import TopicReader, accept_range_fetch, produce, running
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


async def test_word_count_counts_every_word_exactly(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    lines, words, counts = await make_topic(1), await make_topic(1), await make_topic(1)
    await accept_range_fetch(coordinator_url, lines, words)
    env = {"WORDCOUNT_LINES": lines, "WORDCOUNT_WORDS": words, "WORDCOUNT_COUNTS": counts}
    with mock.patch.dict(os.environ, env):
        topology = streams_wordcount.build_topology()
    await produce(
        kafka_bootstrap, lines, [(b"l%d" % i, line.encode(), None) for i, line in enumerate(LINES)]
    )
    truth = Counter(word for line in LINES for word in line.split())
    app = StreamsApp(topology, config(f"wc-{lines}", kafka_bootstrap, coordinator_url, tmp_path))
    async with running(app), TopicReader(kafka_bootstrap, counts) as reader:

        async def counted() -> bool:
            await reader.poll()
            return reader.latest() == dict(truth)

        await until(counted, 60, "every word counted")
        answer = await app.query("counts", "fox")
        assert answer.local and answer.value == truth["fox"]
    assert len(reader.records) == sum(truth.values())
