"""A windowed count with stream-time punctuation: records are counted per key in tumbling
windows of ``WINDOW_MS`` (default 1000) by their timestamps, and a stream-time punctuation
every window emits the windows that closed (their end at or before the task's stream time),
once each and in window order. A record for a window that already closed is late and
dropped, as with a grace period of zero in Kafka Streams.

Topics from the environment: ``WINDOW_INPUT`` (default ``clicks``), ``WINDOW_OUTPUT``
(default ``click-windows``).
"""

from __future__ import annotations

import os
from typing import Any

from client.streams import JSON, STREAM_TIME, STRING, Processor, StoreSpec, Topology


class WindowedCount(Processor):
    def __init__(self, window_ms: int) -> None:
        self._window_ms = window_ms
        # Windows ending at or before this stream time were emitted: later records are late.
        self._closed_until = -1
        self.late = 0

    def init(self, context: Any) -> None:
        super().init(context)
        context.schedule(self._window_ms, STREAM_TIME, self._emit_closed)

    def process(self, key: str, value: Any) -> None:
        start = self.context.timestamp // self._window_ms * self._window_ms
        if start + self._window_ms <= self._closed_until:
            self.late += 1
            return
        windows = self.context.state_store("windows")
        counts = windows.get(key) or {}
        counts[str(start)] = counts.get(str(start), 0) + 1
        windows.put(key, counts)

    def _emit_closed(self, stream_time: int) -> None:
        self._closed_until = stream_time
        windows = self.context.state_store("windows")
        for key, counts in windows.all():
            closed = sorted(
                (int(start), count)
                for start, count in counts.items()
                if int(start) + self._window_ms <= stream_time
            )
            for start, count in closed:
                end = start + self._window_ms
                self.context.forward(key, {"start": start, "end": end, "count": count})
                del counts[str(start)]
            if not closed:
                continue
            if counts:
                windows.put(key, counts)
            else:
                windows.delete(key)


def build_topology() -> Topology:
    window_ms = int(os.environ.get("WINDOW_MS", "1000"))
    source = os.environ.get("WINDOW_INPUT", "clicks")
    output = os.environ.get("WINDOW_OUTPUT", "click-windows")
    return (
        Topology()
        .add_source("clicks", source, key_serde=STRING, value_serde=JSON)
        .add_processor("count", lambda: WindowedCount(window_ms), "clicks")
        .add_state_store(StoreSpec("windows", STRING, JSON), "count")
        .add_sink("out", output, "count", key_serde=STRING, value_serde=JSON)
    )
