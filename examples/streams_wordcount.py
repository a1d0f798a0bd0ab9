"""Word count with a persistent store: lines are split into words, re-keyed by word through
a topic (so each word's count lives in the task owning the word's key range), and counted
in a RocksDB store; every new count goes to the output topic.

    keyrange streams examples.streams_wordcount:build_topology --application-id wordcount \\
        --bootstrap localhost:9092 --coordinator http://localhost:8080

Topics from the environment: ``WORDCOUNT_LINES`` (default ``lines``), ``WORDCOUNT_WORDS``
(the re-keying topic, default ``words``), ``WORDCOUNT_COUNTS`` (default ``word-counts``).
``WORDCOUNT_LOOKUP_MS`` adds that much simulated I/O (an external lookup) per counted word,
as the benchmark does.
"""

from __future__ import annotations

import os
import time

from client.streams import INT64, STRING, Processor, StoreSpec, Topology


class SplitLines(Processor):
    def process(self, key: object, value: str | None) -> None:
        for word in (value or "").lower().split():
            self.context.forward(word, 1)


class CountWords(Processor):
    def __init__(self, lookup_s: float = 0.0) -> None:
        self._lookup_s = lookup_s

    def process(self, key: str, value: int) -> None:
        if self._lookup_s:
            time.sleep(self._lookup_s)
        counts = self.context.state_store("counts")
        count = (counts.get(key) or 0) + value
        counts.put(key, count)
        self.context.forward(key, count)


def build_topology() -> Topology:
    lines = os.environ.get("WORDCOUNT_LINES", "lines")
    words = os.environ.get("WORDCOUNT_WORDS", "words")
    counts = os.environ.get("WORDCOUNT_COUNTS", "word-counts")
    lookup_s = float(os.environ.get("WORDCOUNT_LOOKUP_MS", "0")) / 1000
    return (
        Topology()
        .add_source("lines", lines, key_serde=STRING, value_serde=STRING)
        .add_processor("split", SplitLines, "lines")
        .add_sink("to-words", words, "split", key_serde=STRING, value_serde=INT64)
        .add_source("words", words, key_serde=STRING, value_serde=INT64)
        .add_processor("count", lambda: CountWords(lookup_s), "words")
        .add_state_store(StoreSpec("counts", STRING, INT64, persistent=True), "count")
        .add_sink("to-counts", counts, "count", key_serde=STRING, value_serde=INT64)
    )
