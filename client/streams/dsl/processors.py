"""The processors the DSL compiles its steps to: plain ``Processor`` subclasses, so a DSL
application runs on the processor API's runtime and nothing else."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from client.streams.processor import KeyValueStore, Processor, ProcessorContext

KeyValue = tuple[Any, Any]


class Filter(Processor):
    def __init__(self, predicate: Callable[[Any, Any], bool]) -> None:
        self._predicate = predicate

    def process(self, key: Any, value: Any) -> None:
        if self._predicate(key, value):
            self.context.forward(key, value)


class Map(Processor):
    def __init__(self, mapper: Callable[[Any, Any], KeyValue]) -> None:
        self._mapper = mapper

    def process(self, key: Any, value: Any) -> None:
        new_key, new_value = self._mapper(key, value)
        self.context.forward(new_key, new_value)


class MapValues(Processor):
    def __init__(self, mapper: Callable[[Any], Any]) -> None:
        self._mapper = mapper

    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, self._mapper(value))


class FlatMap(Processor):
    def __init__(self, mapper: Callable[[Any, Any], Iterable[KeyValue]]) -> None:
        self._mapper = mapper

    def process(self, key: Any, value: Any) -> None:
        for new_key, new_value in self._mapper(key, value):
            self.context.forward(new_key, new_value)


class FlatMapValues(Processor):
    def __init__(self, mapper: Callable[[Any], Iterable[Any]]) -> None:
        self._mapper = mapper

    def process(self, key: Any, value: Any) -> None:
        for new_value in self._mapper(value):
            self.context.forward(key, new_value)


class Peek(Processor):
    def __init__(self, action: Callable[[Any, Any], None]) -> None:
        self._action = action

    def process(self, key: Any, value: Any) -> None:
        self._action(key, value)
        self.context.forward(key, value)


class Branch(Processor):
    """Each record to the first branch whose predicate holds (Kafka Streams' ``split``)."""

    def __init__(self, predicates: list[tuple[str, Callable[[Any, Any], bool]]]) -> None:
        self._predicates = predicates

    def process(self, key: Any, value: Any) -> None:
        for child, predicate in self._predicates:
            if predicate(key, value):
                self.context.forward(key, value, to=child)
                return


class PassThrough(Processor):
    """A node with several parents (a merge) or a table's changes handed to a stream."""

    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, value)


class Aggregate(Processor):
    """count, reduce and aggregate: the key's aggregate in a key-value store, its changes
    forwarded (the table's changes): every update, or with the record cache on the last per
    key as it leaves the cache, as in Kafka Streams. A record without a key or a value is
    skipped, as in Kafka Streams."""

    def __init__(
        self,
        store: str,
        initializer: Callable[[], Any],
        adder: Callable[[Any, Any, Any], Any],
    ) -> None:
        self._store_name = store
        self._initializer = initializer
        self._adder = adder
        self._store: KeyValueStore
        self._cached = False

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._store = context.state_store(self._store_name)
        self._cached = context.forward_on_flush(self._store_name)

    def process(self, key: Any, value: Any) -> None:
        if key is None or value is None:
            return
        current = self._store.get(key)
        aggregate = self._adder(key, value, self._initializer() if current is None else current)
        self._store.put(key, aggregate)
        if not self._cached:
            self.context.forward(key, aggregate)


class TableSource(Processor):
    """A table read from a topic: the latest value per key (None deletes), every change
    forwarded."""

    def __init__(self, store: str) -> None:
        self._store_name = store
        self._store: KeyValueStore

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._store = context.state_store(self._store_name)

    def process(self, key: Any, value: Any) -> None:
        if key is None:
            return
        self._store.put(key, value)
        self.context.forward(key, value)


class StreamTableJoin(Processor):
    """Each stream record joined with the table's current value for its key; an inner join
    drops a record the table has no value for."""

    def __init__(self, store: str, joiner: Callable[[Any, Any], Any], *, left: bool) -> None:
        self._store_name = store
        self._joiner = joiner
        self._left = left
        self._store: KeyValueStore

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._store = context.state_store(self._store_name)

    def process(self, key: Any, value: Any) -> None:
        if key is None or value is None:
            return
        other = self._store.get(key)
        if other is None and not self._left:
            return
        self.context.forward(key, self._joiner(value, other))


class TableTableJoinSide(Processor):
    """One side of a table-table join: a change of this side met with the other side's
    current value. A join result that stops existing (this side deleted while the other has
    a value) forwards a tombstone; a change meeting no value on a side the join needs (either
    side of an inner join, the left side of a left join) forwards nothing, as in Kafka
    Streams: there was no result to retract."""

    def __init__(
        self, other_store: str, joiner: Callable[[Any, Any], Any], *, this_is_left: bool, left: bool
    ) -> None:
        self._other_name = other_store
        self._joiner = joiner
        self._this_is_left = this_is_left
        self._left = left
        self._other: KeyValueStore

    def init(self, context: ProcessorContext) -> None:
        super().init(context)
        self._other = context.state_store(self._other_name)

    def process(self, key: Any, value: Any) -> None:
        if key is None:
            return
        other = self._other.get(key)
        if other is None and not (self._left and self._this_is_left):
            return
        left_value, right_value = (value, other) if self._this_is_left else (other, value)
        if left_value is None or (right_value is None and not self._left):
            self.context.forward(key, None)
            return
        self.context.forward(key, self._joiner(left_value, right_value))
