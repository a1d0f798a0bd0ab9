"""The DSL's streams and tables: each step adds processors, sinks, sources and stores to the
builder's ``Topology`` and returns the next stream or table. Pure: nothing here runs.

A stream whose key a step may have changed (``map``, ``flat_map``, ``group_by``'s selector)
is marked re-keyed; grouping it by key or joining it goes through a repartition topic first,
so every record of a key reaches the task owning the key's range, as in Kafka Streams.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from client.streams.dsl.base import FIRST, Builder, checked, counted, reducing, summed
from client.streams.dsl.processors import (
    Aggregate,
    Branch,
    Filter,
    FlatMap,
    FlatMapValues,
    Map,
    MapValues,
    PassThrough,
    Peek,
    StreamTableJoin,
    TableTableJoinSide,
)
from client.streams.dsl.windowed import Emit, aggregate_supplier
from client.streams.processor import Processor
from client.streams.serde import INT64, JSON, Serde
from client.streams.topology import StoreSpec
from client.streams.windows import SessionWindows, TimeWindows, WindowedSerde, Windows


class Stream:
    """A stream of records (Kafka Streams' ``KStream``, Quix Streams' ``StreamingDataFrame``).
    ``key_serde`` and ``value_serde`` say how its keys and values are written where they
    leave the process (a repartition topic, a sink, a store); a step that makes new keys or
    values takes new ones, JSON unless given."""

    def __init__(
        self,
        builder: Builder,
        node: str,
        key_serde: Serde,
        value_serde: Serde,
        *,
        rekeyed: bool = False,
    ) -> None:
        self._builder = builder
        self.node = node
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.rekeyed = rekeyed

    def _then(
        self,
        operation: str,
        name: str | None,
        supplier: Callable[[], Processor],
        *,
        key_serde: Serde | None = None,
        value_serde: Serde | None = None,
        rekeyed: bool | None = None,
    ) -> Stream:
        with self._builder.step(operation, name) as node:
            self._builder.topology.add_processor(node, supplier, self.node)
        return Stream(
            self._builder,
            node,
            key_serde or self.key_serde,
            value_serde or self.value_serde,
            rekeyed=self.rekeyed if rekeyed is None else rekeyed,
        )

    # ------------------------------------------------------------ stateless

    def filter(self, predicate: Callable[[Any, Any], bool], *, name: str | None = None) -> Stream:
        checked(self._builder, "filter", predicate=predicate)
        return self._then("filter", name, lambda: Filter(predicate))

    def map(
        self,
        mapper: Callable[[Any, Any], tuple[Any, Any]],
        *,
        key_serde: Serde = JSON,
        value_serde: Serde = JSON,
        name: str | None = None,
    ) -> Stream:
        """(key, value) -> (new key, new value)."""
        checked(self._builder, "map", mapper=mapper)
        return self._then(
            "map",
            name,
            lambda: Map(mapper),
            key_serde=key_serde,
            value_serde=value_serde,
            rekeyed=True,
        )

    def map_values(
        self, mapper: Callable[[Any], Any], *, value_serde: Serde = JSON, name: str | None = None
    ) -> Stream:
        checked(self._builder, "map_values", mapper=mapper)
        return self._then("map_values", name, lambda: MapValues(mapper), value_serde=value_serde)

    def flat_map(
        self,
        mapper: Callable[[Any, Any], Iterable[tuple[Any, Any]]],
        *,
        key_serde: Serde = JSON,
        value_serde: Serde = JSON,
        name: str | None = None,
    ) -> Stream:
        """(key, value) -> any number of (new key, new value)."""
        checked(self._builder, "flat_map", mapper=mapper)
        return self._then(
            "flat_map",
            name,
            lambda: FlatMap(mapper),
            key_serde=key_serde,
            value_serde=value_serde,
            rekeyed=True,
        )

    def flat_map_values(
        self,
        mapper: Callable[[Any], Iterable[Any]],
        *,
        value_serde: Serde = JSON,
        name: str | None = None,
    ) -> Stream:
        checked(self._builder, "flat_map_values", mapper=mapper)
        return self._then(
            "flat_map_values", name, lambda: FlatMapValues(mapper), value_serde=value_serde
        )

    def peek(self, action: Callable[[Any, Any], None], *, name: str | None = None) -> Stream:
        checked(self._builder, "peek", action=action)
        return self._then("peek", name, lambda: Peek(action))

    def branch(
        self, *predicates: Callable[[Any, Any], bool], name: str | None = None
    ) -> list[Stream]:
        """One stream per predicate: each record goes to the first whose predicate holds
        (none: dropped; ``lambda key, value: True`` last catches the rest)."""
        if not predicates:
            raise self._builder.fail("branch", "needs at least one predicate")
        checked(self._builder, "branch", **{f"predicate {i}": p for i, p in enumerate(predicates)})
        topology = self._builder.topology
        with self._builder.step("branch", name) as node:
            children = [f"{node}-{index}" for index in range(len(predicates))]
            pairs = list(zip(children, predicates, strict=True))
            topology.add_processor(node, lambda: Branch(pairs), self.node)
            for child in children:
                topology.add_processor(child, PassThrough, node)
        return [
            Stream(self._builder, child, self.key_serde, self.value_serde, rekeyed=self.rekeyed)
            for child in children
        ]

    def merge(self, other: Stream, *, name: str | None = None) -> Stream:
        """Both streams' records as one (their topics end up co-partitioned: one task reads
        partition p of both)."""
        with self._builder.step("merge", name) as node:
            self._builder.topology.add_processor(node, PassThrough, self.node, other.node)
        return Stream(
            self._builder,
            node,
            self.key_serde,
            self.value_serde,
            rekeyed=self.rekeyed or other.rekeyed,
        )

    def to(
        self,
        topic: str,
        *,
        key_serde: Serde | None = None,
        value_serde: Serde | None = None,
        name: str | None = None,
    ) -> None:
        with self._builder.step("to", name) as node:
            self._builder.topology.add_sink(
                node,
                topic,
                self.node,
                key_serde=key_serde or self.key_serde,
                value_serde=value_serde or self.value_serde,
            )

    # ------------------------------------------------------------ re-keying

    def repartition(
        self,
        *,
        key_serde: Serde | None = None,
        value_serde: Serde | None = None,
        partitions: int | None = None,
        name: str | None = None,
    ) -> Stream:
        """Through the internal topic ``<application id>-<name>-repartition`` (created by the
        app with ``partitions``, default as many as the topics this part reads)."""
        key_serde = key_serde or self.key_serde
        value_serde = value_serde or self.value_serde
        topology = self._builder.topology
        with self._builder.step("repartition", name) as node:
            topic = f"{node}-repartition"
            topology.add_internal_topic(topic, partitions)
            topology.add_sink(
                f"{node}-sink", topic, self.node, key_serde=key_serde, value_serde=value_serde
            )
            topology.add_source(node, topic, key_serde=key_serde, value_serde=value_serde)
        return Stream(self._builder, node, key_serde, value_serde)

    def group_by(
        self,
        selector: Callable[[Any, Any], Any],
        *,
        key_serde: Serde = JSON,
        value_serde: Serde | None = None,
        partitions: int | None = None,
        name: str | None = None,
    ) -> GroupedStream:
        """Group by a new key, ``selector(key, value)``: re-keyed through a repartition topic
        named after the step."""
        checked(self._builder, "group_by", selector=selector)
        with self._builder.step("group_by", name) as node:
            self._builder.topology.add_processor(
                f"{node}-select", lambda: Map(lambda k, v: (selector(k, v), v)), self.node
            )
        selected = Stream(self._builder, f"{node}-select", key_serde, self.value_serde)
        stream = selected.repartition(value_serde=value_serde, partitions=partitions, name=node)
        return GroupedStream(self._builder, stream)

    def group_by_key(
        self,
        *,
        key_serde: Serde | None = None,
        value_serde: Serde | None = None,
        partitions: int | None = None,
        name: str | None = None,
    ) -> GroupedStream:
        """Group by the current key; a re-keyed stream goes through a repartition topic."""
        stream = self
        if self.rekeyed:
            stream = self.repartition(
                key_serde=key_serde, value_serde=value_serde, partitions=partitions, name=name
            )
        return GroupedStream(self._builder, stream)

    # ------------------------------------------------------------ joins

    def join(
        self,
        table: Table,
        joiner: Callable[[Any, Any], Any],
        *,
        left: bool = False,
        value_serde: Serde = JSON,
        name: str | None = None,
    ) -> Stream:
        """Each record with the table's current value for its key, ``joiner(value,
        table_value)``; ``left`` keeps records the table has no value for (None). The stream
        and the table's topic must be co-partitioned (same key bytes, same partitioner,
        same partition count)."""
        operation = "left_join" if left else "join"
        checked(self._builder, operation, joiner=joiner)
        store = table.require_store(operation)
        stream = self.repartition() if self.rekeyed else self
        with self._builder.step(operation, name) as node:
            self._builder.topology.add_processor(
                node, lambda: StreamTableJoin(store, joiner, left=left), stream.node
            )
            self._builder.topology.connect_store(store, node)
        return Stream(self._builder, node, stream.key_serde, value_serde)

    def left_join(
        self,
        table: Table,
        joiner: Callable[[Any, Any], Any],
        *,
        value_serde: Serde = JSON,
        name: str | None = None,
    ) -> Stream:
        return self.join(table, joiner, left=True, value_serde=value_serde, name=name)


class GroupedStream:
    """A stream grouped by key, ready to aggregate into a table."""

    def __init__(self, builder: Builder, stream: Stream) -> None:
        self._builder = builder
        self._stream = stream

    def count(
        self, *, store: str | None = None, persistent: bool = True, name: str | None = None
    ) -> Table:
        return self._aggregate("count", lambda: 0, counted, INT64, store, persistent, name)

    def reduce(
        self,
        reducer: Callable[[Any, Any], Any],
        *,
        store: str | None = None,
        persistent: bool = True,
        name: str | None = None,
    ) -> Table:
        """``reducer(aggregate, value)``; a key's first value is its first aggregate."""
        checked(self._builder, "reduce", reducer=reducer)
        value_serde = self._stream.value_serde
        initial: Callable[[], Any] = lambda: FIRST  # noqa: E731
        return self._aggregate(
            "reduce", initial, reducing(reducer), value_serde, store, persistent, name
        )

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        *,
        value_serde: Serde = JSON,
        store: str | None = None,
        persistent: bool = True,
        name: str | None = None,
    ) -> Table:
        """``aggregator(key, value, aggregate)``, starting from ``initializer()``."""
        checked(self._builder, "aggregate", initializer=initializer, aggregator=aggregator)
        return self._aggregate(
            "aggregate", initializer, aggregator, value_serde, store, persistent, name
        )

    def windowed_by(self, windows: Windows) -> WindowedGroupedStream:
        if not isinstance(windows, TimeWindows | SessionWindows):
            raise self._builder.fail("windowed_by", f"{windows!r} is not a window definition")
        return WindowedGroupedStream(self._builder, self._stream, windows)

    def _aggregate(
        self,
        operation: str,
        initializer: Callable[[], Any],
        adder: Callable[[Any, Any, Any], Any],
        value_serde: Serde,
        store: str | None,
        persistent: bool,
        name: str | None,
    ) -> Table:
        key_serde = self._stream.key_serde
        topology = self._builder.topology
        with self._builder.step(operation, name) as node:
            store_name = store or f"{node}-store"
            topology.add_processor(
                node, lambda: Aggregate(store_name, initializer, adder), self._stream.node
            )
            topology.add_state_store(
                StoreSpec(store_name, key_serde, value_serde, persistent=persistent), node
            )
        return Table(self._builder, node, store_name, key_serde, value_serde)


class WindowedGroupedStream:
    """A grouped stream in windows: its aggregations make ``WindowedTable``s."""

    def __init__(self, builder: Builder, stream: Stream, windows: Windows) -> None:
        self._builder = builder
        self._stream = stream
        self._windows = windows

    def count(
        self, *, store: str | None = None, persistent: bool = True, name: str | None = None
    ) -> WindowedTable:
        return self._aggregate("count", lambda: 0, counted, summed, INT64, store, persistent, name)

    def reduce(
        self,
        reducer: Callable[[Any, Any], Any],
        *,
        store: str | None = None,
        persistent: bool = True,
        name: str | None = None,
    ) -> WindowedTable:
        checked(self._builder, "reduce", reducer=reducer)
        add = reducing(reducer)

        def merge(key: Any, aggregate: Any, other: Any) -> Any:
            return add(key, other, aggregate)

        initial: Callable[[], Any] = lambda: FIRST  # noqa: E731
        value_serde = self._stream.value_serde
        return self._aggregate("reduce", initial, add, merge, value_serde, store, persistent, name)

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        *,
        merger: Callable[[Any, Any, Any], Any] | None = None,
        value_serde: Serde = JSON,
        store: str | None = None,
        persistent: bool = True,
        name: str | None = None,
    ) -> WindowedTable:
        """``aggregator(key, value, aggregate)`` per window; session windows also need
        ``merger(key, aggregate, other)`` to combine the sessions a record joins."""
        checked(self._builder, "aggregate", initializer=initializer, aggregator=aggregator)
        if isinstance(self._windows, SessionWindows) and not callable(merger):
            raise self._builder.fail("aggregate", "session windows need a callable merger")
        return self._aggregate(
            "aggregate", initializer, aggregator, merger, value_serde, store, persistent, name
        )

    def _aggregate(
        self,
        operation: str,
        initializer: Callable[[], Any],
        adder: Callable[[Any, Any, Any], Any],
        merger: Callable[[Any, Any, Any], Any] | None,
        value_serde: Serde,
        store: str | None,
        persistent: bool,
        name: str | None,
    ) -> WindowedTable:
        windows = self._windows
        key_serde = self._stream.key_serde
        emit = Emit()
        topology = self._builder.topology
        with self._builder.step(f"{windows.kind}_{operation}", name) as node:
            store_name = store or f"{node}-store"
            supplier = aggregate_supplier(store_name, windows, initializer, adder, merger, emit)
            topology.add_processor(node, supplier, self._stream.node)
            spec = StoreSpec(
                store_name,
                key_serde,
                value_serde,
                persistent=persistent,
                retention_ms=windows.store_retention_ms(),
            )
            topology.add_state_store(spec, node)
        return WindowedTable(self._builder, node, store_name, key_serde, value_serde, emit)


class Table:
    """A table: the latest value per key in a store (``store`` None: not materialized, as
    a join's result), its changes flowing on to whatever reads it."""

    def __init__(
        self,
        builder: Builder,
        node: str,
        store: str | None,
        key_serde: Serde,
        value_serde: Serde,
    ) -> None:
        self._builder = builder
        self.node = node
        self.store = store
        self.key_serde = key_serde
        self.value_serde = value_serde

    def to_stream(self) -> Stream:
        """The table's changes as a stream (a deletion as a None value)."""
        return Stream(self._builder, self.node, self.key_serde, self.value_serde)

    def require_store(self, operation: str) -> str:
        if self.store is None:
            raise self._builder.fail(
                operation, f"table '{self.node}' has no store (a join's result is not materialized)"
            )
        return self.store

    def join(
        self,
        other: Table,
        joiner: Callable[[Any, Any], Any],
        *,
        left: bool = False,
        value_serde: Serde = JSON,
        name: str | None = None,
    ) -> Table:
        """A table of ``joiner(value, other_value)`` per key, updated on either side's
        change; inner unless ``left``. Both tables' topics must be co-partitioned."""
        operation = "table_left_join" if left else "table_join"
        checked(self._builder, operation, joiner=joiner)
        mine, theirs = self.require_store(operation), other.require_store(operation)
        topology = self._builder.topology
        with self._builder.step(operation, name) as node:
            left_side, right_side = f"{node}-left", f"{node}-right"
            topology.add_processor(
                left_side,
                lambda: TableTableJoinSide(theirs, joiner, this_is_left=True, left=left),
                self.node,
            )
            topology.add_processor(
                right_side,
                lambda: TableTableJoinSide(mine, joiner, this_is_left=False, left=left),
                other.node,
            )
            topology.connect_store(theirs, left_side)
            topology.connect_store(mine, right_side)
            topology.add_processor(node, PassThrough, left_side, right_side)
        return Table(self._builder, node, None, self.key_serde, value_serde)


class WindowedTable:
    """A windowed aggregation's table: keyed by ``Windowed(key, start, end)``. Its stream
    carries every update, or after ``final()`` each window's result once, when it closes."""

    def __init__(
        self,
        builder: Builder,
        node: str,
        store: str,
        key_serde: Serde,
        value_serde: Serde,
        emit: Emit,
    ) -> None:
        self._builder = builder
        self.node = node
        self.store = store
        self.key_serde = key_serde
        self.value_serde = value_serde
        self._emit = emit
        self._streamed = False

    def final(self) -> WindowedTable:
        """Emit each window once, when it closes (Kafka Streams' ``suppress(untilWindow
        Closes)``, Quix Streams' ``.final()``)."""
        if self._streamed:
            raise self._builder.fail(
                "final", f"'{self.node}' already has a stream: call final() first"
            )
        self._emit.final = True
        return self

    def to_stream(self) -> Stream:
        """Windowed keys, written by ``WindowedSerde`` of the key serde unless a step maps
        them to something else."""
        self._streamed = True
        return Stream(self._builder, self.node, WindowedSerde(self.key_serde), self.value_serde)
