"""The streams DSL: streams and tables from topics, stateless steps, grouping (re-keyed
through repartition topics), aggregations, windows and joins, compiled onto the processor
API's ``Topology`` (no runtime of its own). See docs/streams.md for the mapping to Kafka
Streams' DSL and Quix Streams' dataframe.

    builder = StreamsBuilder()
    (builder.stream("lines", key_serde=STRING, value_serde=STRING)
        .flat_map_values(str.split)
        .group_by(lambda key, word: word, key_serde=STRING)
        .count()
        .to_stream()
        .to("word-counts"))
    topology = builder.build()
"""

from __future__ import annotations

from client.streams.dsl.api import (
    GroupedStream,
    Stream,
    Table,
    WindowedGroupedStream,
    WindowedTable,
)
from client.streams.dsl.builder import StreamsBuilder
from client.streams.windows import (
    SessionWindows,
    TimeWindows,
    Windowed,
    WindowedSerde,
    hopping,
    session,
    tumbling,
)

__all__ = [
    "GroupedStream",
    "SessionWindows",
    "Stream",
    "StreamsBuilder",
    "Table",
    "TimeWindows",
    "Windowed",
    "WindowedGroupedStream",
    "WindowedSerde",
    "WindowedTable",
    "hopping",
    "session",
    "tumbling",
]
