"""Page views per user in 1-minute tumbling windows, each window's count emitted once, when
it closes (final results), in the DSL. Input records are keyed by user id; each output
record is keyed by user id with ``{"start", "end", "views"}`` as its JSON value.

    keyrange streams examples.streams_dsl_pageviews:build_topology --application-id pageviews \\
        --bootstrap localhost:9092 --coordinator http://localhost:8080

From the environment: ``PAGEVIEWS_INPUT`` (default ``page-views``), ``PAGEVIEWS_OUTPUT``
(default ``page-views-per-minute``), ``PAGEVIEWS_WINDOW_MS`` (default 60000),
``PAGEVIEWS_GRACE_MS`` (default 0: a record for a closed window is late and dropped),
``PAGEVIEWS_LOOKUP_MS`` (simulated I/O per view, for the benchmark).

``views_per_window`` is the counting part alone, so the fault suite
(``tests/chaos/targets.py``) runs these very steps between journaling ones.
"""

from __future__ import annotations

import os
import time
from typing import Any

from client.streams import JSON, STRING, Topology
from client.streams.dsl import Stream, StreamsBuilder, Windowed, tumbling


def views_per_window(views: Stream) -> Stream:
    """Each user's views per window, once the window closed, as ``(user, {"start", "end",
    "views"})``; windows and grace from the environment."""
    window_ms = int(os.environ.get("PAGEVIEWS_WINDOW_MS", "60000"))
    grace_ms = int(os.environ.get("PAGEVIEWS_GRACE_MS", "0"))

    def as_record(window: Windowed, count: int) -> tuple[str, dict[str, int]]:
        return window.key, {"start": window.start, "end": window.end, "views": count}

    return (
        views.group_by_key()
        .windowed_by(tumbling(window_ms, grace_ms=grace_ms))
        .count(store="views-per-window")
        .final()
        .to_stream()
        .map(as_record, key_serde=STRING, value_serde=JSON)
    )


def build_topology() -> Topology:
    source = os.environ.get("PAGEVIEWS_INPUT", "page-views")
    output = os.environ.get("PAGEVIEWS_OUTPUT", "page-views-per-minute")
    lookup_s = float(os.environ.get("PAGEVIEWS_LOOKUP_MS", "0")) / 1000

    def look_up(user: str, view: Any) -> None:
        time.sleep(lookup_s)

    builder = StreamsBuilder()
    views = builder.stream(source, key_serde=STRING, value_serde=JSON)
    if lookup_s:
        views = views.peek(look_up)
    views_per_window(views).to(output)
    return builder.build()
