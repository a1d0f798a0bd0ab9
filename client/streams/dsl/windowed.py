"""The processors of windowed aggregations: time windows (tumbling, hopping) and sessions,
over a window store, emitting every update or each window's final result once it closes.

Final results: a window closes when the task's stream time passes it (``client.streams.
windows``); the task then forwards its aggregate once and marks it final in the store (a
changelogged write), so the key range's next owner, whose stream time starts over, neither
emits it again nor lets a replayed record change it. Closing is looked for only when stream
time reaches the earliest end among the windows not yet emitted, which the processor keeps
in memory (read from the store once at ``init``, after the restore), and before a record's
own writes, which may expire the store's old segments: a window the store expires has
closed (its retention is at least its size plus the grace period, and the store
expires by the latest window end, at most a size past stream time), so it was emitted first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from client.streams.processor import Processor, ProcessorContext, WindowStore
from client.streams.windows import SessionWindows, TimeWindows, Windowed

_TIME_MAX = 2**63 - 1


@dataclass
class Emit:
    """How a windowed aggregation emits; ``final`` is set by the table's ``final()``."""

    final: bool = False


class _Windowed(Processor):
    def __init__(self, store: str, emit: Emit) -> None:
        self._store_name = store
        self._emit = emit
        self._store: WindowStore
        # The ends of windows not emitted yet (final mode) and the earliest of them, and how
        # many records were late.
        self._pending: set[int] = set()
        self._earliest = _TIME_MAX
        # Every window ending by this was emitted: those since the last commit are not
        # marked final in the store yet (``_emit_closed``), yet are as final to this task.
        self._emitted_until = -1
        self.late = 0

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._store = context.window_store(self._store_name)
        if self._emit.final:
            self._pending = {
                end for _, _, end, _, final in self._store.ended(0, _TIME_MAX) if not final
            }
            self._earliest = min(self._pending, default=_TIME_MAX)

    def _pend(self, end: int) -> None:
        self._pending.add(end)
        self._earliest = min(self._earliest, end)

    def _close_until(self, stream_time: int) -> int:
        raise NotImplementedError

    def _final(self, end: int, marked: bool) -> bool:
        """Whether a window's final result was emitted: marked in the store, or emitted by
        this task since its last commit and so waiting for its mark."""
        return marked or end <= self._emitted_until

    def _emit_closed(self) -> None:
        """Forward the closed windows' results; their final marks are written only once
        Kafka acknowledged the results (at the task's next commit), so no crash, lost
        session or refused sink record can leave a window marked whose result is not in the
        output topic: the window's next owner finds it unmarked and emits it."""
        close_until = self._close_until(self.context.stream_time)
        if self._earliest > close_until:
            return
        self._emitted_until = max(self._emitted_until, close_until)
        # Every window ending before the earliest pending end was emitted already.
        closed = [row for row in self._store.ended(self._earliest, close_until) if not row[4]]
        closed.sort(key=lambda row: (row[2], row[1]))
        for key, start, end, value, _ in closed:
            self.context.forward(Windowed(key, start, end), value)
        if closed:
            self.context.after_outputs_acknowledged(partial(self._mark_final, closed))
        self._pending = {end for end in self._pending if end > close_until}
        self._earliest = min(self._pending, default=_TIME_MAX)

    def _mark_final(self, closed: list[Any]) -> None:
        for key, start, end, value, _ in closed:
            self._store.put(key, start, end, value, final=True)


class TimeWindowAggregate(_Windowed):
    """count, reduce and aggregate per key and time window."""

    def __init__(
        self,
        store: str,
        windows: TimeWindows,
        initializer: Callable[[], Any],
        adder: Callable[[Any, Any, Any], Any],
        emit: Emit,
    ) -> None:
        super().__init__(store, emit)
        self._windows = windows
        self._initializer = initializer
        self._adder = adder

    def _close_until(self, stream_time: int) -> int:
        return stream_time - self._windows.grace_ms

    def process(self, key: Any, value: Any) -> None:
        if key is None or value is None:
            return
        stream_time = self.context.stream_time
        final = self._emit.final
        if final:
            # Before this record's writes: they may expire old segments of the store.
            self._emit_closed()
        for start, end in self._windows.windows_for(self.context.timestamp):
            if self._windows.closed(end, stream_time):
                self.late += 1
                continue
            found = self._store.entry(key, start, end)
            if found is not None and found[1]:
                self.late += 1
                continue
            current = self._initializer() if found is None else found[0]
            aggregate = self._adder(key, value, current)
            self._store.put(key, start, end, aggregate)
            if final:
                self._pend(end)
            else:
                self.context.forward(Windowed(key, start, end), aggregate)


class SessionAggregate(_Windowed):
    """count, reduce and aggregate per key and session: a record merges every session it
    falls within ``gap_ms`` of into one (their aggregates combined by ``merger``); in update
    mode each merged-away session is retracted with a tombstone, as in Kafka Streams."""

    def __init__(
        self,
        store: str,
        windows: SessionWindows,
        initializer: Callable[[], Any],
        adder: Callable[[Any, Any, Any], Any],
        merger: Callable[[Any, Any, Any], Any],
        emit: Emit,
    ) -> None:
        super().__init__(store, emit)
        self._windows = windows
        self._initializer = initializer
        self._adder = adder
        self._merger = merger

    def _close_until(self, stream_time: int) -> int:
        return stream_time - self._windows.gap_ms - self._windows.grace_ms - 1

    def process(self, key: Any, value: Any) -> None:
        if key is None or value is None:
            return
        timestamp = self.context.timestamp
        if self._emit.final:
            self._emit_closed()
        gap = self._windows.gap_ms
        merged = self._store.sessions(key, timestamp - gap, timestamp + gap)
        start = min([timestamp, *(old_start for old_start, _, _, _ in merged)])
        end = max([timestamp, *(old_end for _, old_end, _, _ in merged)])
        # Late by the merged session's end, as in Kafka Streams: an old record that extends
        # a session still open counts. A session emitted but not yet marked is final too.
        if self._windows.late(end, self.context.stream_time) or any(
            self._final(old_end, final) for _, old_end, _, final in merged
        ):
            self.late += 1
            return
        aggregate = self._initializer()
        for old_start, old_end, old_value, _ in merged:
            aggregate = self._merger(key, aggregate, old_value)
            self._store.put(key, old_start, old_end, None)
            if not self._emit.final:
                self.context.forward(Windowed(key, old_start, old_end), None)
        aggregate = self._adder(key, value, aggregate)
        self._store.put(key, start, end, aggregate)
        if self._emit.final:
            self._pend(end)
        else:
            self.context.forward(Windowed(key, start, end), aggregate)


def aggregate_supplier(
    store: str,
    windows: TimeWindows | SessionWindows,
    initializer: Callable[[], Any],
    adder: Callable[[Any, Any, Any], Any],
    merger: Callable[[Any, Any, Any], Any] | None,
    emit: Emit,
) -> Callable[[], Processor]:
    """What makes a windowed aggregation's processor, once per task."""
    if isinstance(windows, SessionWindows):
        if merger is None:
            raise ValueError("session windows need a merger")
        session_merger = merger
        return lambda: SessionAggregate(store, windows, initializer, adder, session_merger, emit)
    return lambda: TimeWindowAggregate(store, windows, initializer, adder, emit)
