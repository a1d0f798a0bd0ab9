"""Word count in the DSL: the same application as ``examples/streams_wordcount.py`` (lines
split into words, re-keyed by word through a repartition topic the app creates, counted in
a RocksDB store, every new count to the output topic), in five steps.

    keyrange streams examples.streams_dsl_wordcount:build_topology --application-id dsl-wordcount \\
        --bootstrap localhost:9092 --coordinator http://localhost:8080

Topics from the environment: ``WORDCOUNT_LINES`` (default ``lines``), ``WORDCOUNT_COUNTS``
(default ``word-counts``); the repartition topic is ``<application id>-words-repartition``.
``WORDCOUNT_LOOKUP_MS`` adds that much simulated I/O per counted word, as the benchmark does.
"""

from __future__ import annotations

import os
import time
from typing import Any

from client.streams import INT64, STRING, Topology
from client.streams.dsl import StreamsBuilder


def build_topology() -> Topology:
    lines = os.environ.get("WORDCOUNT_LINES", "lines")
    counts = os.environ.get("WORDCOUNT_COUNTS", "word-counts")
    lookup_s = float(os.environ.get("WORDCOUNT_LOOKUP_MS", "0")) / 1000

    def look_up(word: str, one: Any) -> None:
        time.sleep(lookup_s)

    builder = StreamsBuilder()
    words = (
        builder.stream(lines, key_serde=STRING, value_serde=STRING)
        .flat_map_values(lambda line: (line or "").lower().split(), value_serde=STRING)
        .group_by(lambda key, word: word, key_serde=STRING, value_serde=STRING, name="words")
    )
    counted = words.count(store="counts")
    stream = counted.to_stream()
    if lookup_s:
        stream = stream.peek(look_up)
    stream.to(counts, key_serde=STRING, value_serde=INT64)
    return builder.build()
