"""A streams application's metrics per task on its optional Prometheus port: what an operator
of `keyrange streams` sees of records, stream-time lag and restore progress, which
``app.metrics()`` alone shows only to code inside the process."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx

from client.metrics_server import Family
from client.streams import StreamsApp
from client.streams.metrics import streams_families
from tests.fixtures.coordinator import free_port
from tests.fixtures.services import MakeTopic
from tests.observability import dashboard_queries, problems
from tests.streams.harness import TopicReader, running
from tests.streams.test_examples import LINES, config, fed_word_count
from tests.waiting import until

TASK = "0_0[0-7fffffffffffffff]"


def test_each_task_figure_becomes_a_family_labelled_by_task_and_store() -> None:
    tasks: dict[str, dict[str, Any]] = {
        TASK: {
            "records": 7,
            "punctuations": 2,
            "stream_time": 1_000,
            "stream_time_lag_ms": 1_500,
            "buffered": 3,
            "ready": True,
            "restore": [
                {
                    "store": "counts",
                    "read": 40,
                    "restored": 10,
                    "fraction": 1.0,
                    "done": True,
                    "failures": 2,
                    "error": None,
                }
            ],
        },
        "1_0[0-3fffffffffffffff]": {
            "records": 0,
            "punctuations": 0,
            "stream_time": -1,
            "stream_time_lag_ms": None,
            "buffered": 0,
            "ready": False,
            "restore": [],
        },
    }
    families = {family.name: family for family in streams_families(tasks)}
    assert families["keyrange_streams_task_records"] == Family(
        "keyrange_streams_task_records",
        "Input records processed by the task.",
        "counter",
        ("task",),
        [((TASK,), 7.0), (("1_0[0-3fffffffffffffff]",), 0.0)],
    )
    assert families["keyrange_streams_task_punctuations"].kind == "counter"
    assert families["keyrange_streams_task_ready"].samples == [
        ((TASK,), 1.0),
        (("1_0[0-3fffffffffffffff]",), 0.0),
    ]
    # A task that processed nothing has no stream time, so no lag rather than a huge one.
    assert families["keyrange_streams_task_stream_time_lag_seconds"].samples == [((TASK,), 1.5)]
    assert families["keyrange_streams_restore_read"].samples == [((TASK, "counts"), 40.0)]
    assert families["keyrange_streams_restore_restored"].samples == [((TASK, "counts"), 10.0)]
    assert families["keyrange_streams_restore_fraction"].labels == ("task", "store")
    assert families["keyrange_streams_restore_failures"].kind == "counter"
    assert families["keyrange_streams_restore_failures"].samples == [((TASK, "counts"), 2.0)]


def scraped(text: str, name: str) -> dict[str, float]:
    """The samples of metric ``name`` in a Prometheus text page, by their label text."""
    pattern = re.compile(rf"^{name}\{{(.*)\}} (\S+)$", re.MULTILINE)
    return {labels: float(value) for labels, value in pattern.findall(text)}


async def test_the_metrics_port_serves_every_tasks_records_lag_and_restore(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    wc = await fed_word_count(kafka_bootstrap, coordinator_url, make_topic)
    port = free_port()
    app = StreamsApp(
        wc.topology,
        config(f"wcm-{wc.lines}", kafka_bootstrap, coordinator_url, tmp_path, metrics_port=port),
    )
    async with (
        running(app),
        TopicReader(kafka_bootstrap, wc.counts) as reader,
        httpx.AsyncClient() as http,
    ):
        await until(lambda: wc.counted(reader), 60, "every word counted")
        page = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
        expected = app.metrics()
    records = scraped(page, "keyrange_streams_task_records_total")
    # One line and one word per record, through the re-keying sub-topology and the count.
    assert sum(records.values()) == len(LINES) + sum(wc.truth.values())
    assert records == {f'task="{task}"': figures["records"] for task, figures in expected.items()}
    assert set(scraped(page, "keyrange_streams_task_stream_time_lag_seconds")) == set(records)
    fractions = scraped(page, "keyrange_streams_restore_fraction")
    assert fractions and all(value == 1.0 for value in fractions.values())
    assert any('store="counts"' in labels for labels in fractions)
    # What the chart's dashboard reads of a streams application is what it serves.
    assert problems(dashboard_queries(), page, "streams") == []
