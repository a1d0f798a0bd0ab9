"""A stream task: one sub-topology's processors over partition ``p`` of its co-partitioned
source topics, restricted to one key range, with its stores and schedules.

The task is synchronous and does no I/O: records come in through ``add``, are processed by
``process_next``, and what the processors produce (sink records, changelog writes) waits in
``outgoing`` for the runtime to send. Records processed since the last commit wait in
``processed`` until the commit protocol marks them (after the producer flushed), and what a
processor asked to do once its outputs are in Kafka (``after_outputs_acknowledged``: the
final marks of windows emitted) waits in ``after_acknowledged`` for that commit's flush.

Headers travel as in Kafka Streams: what is forwarded while an input record is processed
carries that record's headers down to the sinks, what a punctuation forwards carries none,
and a ``forward`` given headers replaces them for everything downstream of it. Changelog
writes carry none: they are the store's, not the input's.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from client.protocol.keyspace import KeyRange, key_hash
from client.runtime.budget import weight
from client.streams.cache import CacheBudget
from client.streams.clock import TaskInputs, Wait
from client.streams.errors import ProcessorFailed, StreamsError, UnknownStore
from client.streams.processor import (
    STREAM_TIME,
    WALL_CLOCK,
    Cancellable,
    KeyValueStore,
    Processor,
    PunctuationType,
    Punctuator,
    WindowStore,
)
from client.streams.punctuation import Punctuations
from client.streams.stores import BytesStore, ChangelogWrite, TaskStore
from client.streams.topology import BuiltTopology, SinkNode, StoreSpec, SubTopology
from client.streams.window_store import TaskWindowStore, WindowBackend
from client.tracing import RecordSpan, RecordTracer

if TYPE_CHECKING:
    from client.runtime.gate import Lease

logger = logging.getLogger(__name__)

Record = Any
Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class TaskId:
    subtopology: int
    partition: int
    keys: KeyRange

    def __str__(self) -> str:
        return f"{self.subtopology}_{self.partition}[{self.keys.start:x}-{self.keys.end:x}]"


class TaskState(enum.Enum):
    """The only record of where a task is in its life. Set on the loop; a pool thread reads
    it before each record (a plain attribute read), so setting it stops the thread's next
    record, not the one under way."""

    # Created at its slice's assignment; its stores restore and none of its records starts.
    RESTORING = "restoring"
    # Restored and its processors initialized: the one state whose records start.
    RUNNING = "running"
    # A revocation is closing it: no record starts; what it produced still goes out and
    # what it processed is still marked.
    CLOSING = "closing"
    # The membership was lost: no record starts, nothing it produced goes out, nothing it
    # processed is marked (its keys may be another member's).
    HALTED = "halted"


# The one state whose records start: ``StreamTask.active``, and the gate's per-record check
# on pool threads (``task.state is ACTIVE``: a plain attribute read, no call).
ACTIVE = TaskState.RUNNING


class Outgoing(NamedTuple):
    """One record for the producer. A named tuple: made once or twice per record, and a
    frozen dataclass's ``__init__`` (an ``object.__setattr__`` per field) is several times
    slower to make (bench/history/2026-11-26-issue-30-rate-cpu-record-cache.md)."""

    topic: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    changelog_of: str | None = None
    headers: Headers = ()


@dataclass
class TaskMetrics:
    records: int = 0
    punctuations: int = 0
    last_record_timestamp: int = -1


class StreamTask:
    """Processors, stores and clocks of one task; see the module docstring."""

    def __init__(
        self,
        task_id: TaskId,
        topology: BuiltTopology,
        subtopology: SubTopology,
        backends: dict[str, BytesStore],
        application_id: str,
        max_idle_ms: int,
        cache: CacheBudget | None = None,
    ) -> None:
        self.id = task_id
        self.application_id = application_id
        self._topology = topology
        self._sub = subtopology
        self.inputs = TaskInputs(list(subtopology.source_topics), max_idle_ms)
        self.punctuations = Punctuations()
        self.outgoing: list[Outgoing] = []
        self.processed: list[Record] = []
        self.after_acknowledged: list[Callable[[], None]] = []
        # Bytes and records taken off the buffer since the runtime last refunded them to the
        # byte budget, per input topic: written by whichever thread runs the task's round,
        # read on the loop after it.
        self.taken: dict[str, list[int]] = {}
        self.commit_requested = False
        self.metrics = TaskMetrics()
        self.state = TaskState.RESTORING
        # The right to start its records: its slice's lease in the ownership gate.
        self.lease: Lease | None = None
        self.stores: dict[str, TaskStore | TaskWindowStore] = {
            name: _task_store(
                topology.stores[name],
                backends[name],
                task_id.keys,
                self._changelog_writer(name),
                cache,
            )
            for name in subtopology.stores
        }
        self._processors: dict[str, Processor] = {}
        # Each node's children with the sink each is (None for a processor), looked up once
        # here rather than per forward.
        self._routes: dict[str, tuple[tuple[str, SinkNode | None], ...]] = {
            parent: tuple((child, topology.sinks.get(child)) for child in children)
            for parent, children in topology.children.items()
        }
        self._current: Record | None = None
        self._node: str | None = None
        self._headers: Headers = ()
        self.context = TaskContext(self)
        # Spans per record while tracing is on (``client.tracing``).
        self.tracer: RecordTracer | None = None

    def init(self) -> None:
        """Create and ``init`` the processors, parents first (their schedules come first)."""
        for name in self._sub.nodes:
            node = self._topology.processors.get(name)
            if node is not None:
                processor = node.supplier()
                self._processors[name] = processor
                self._node = name
                processor.init(self.context)
        self._node = None
        self.state = TaskState.RUNNING

    @property
    def active(self) -> bool:
        """Whether the task's records may start (the ownership gate's lease and deadline
        aside): the one definition of an active task, for the runtime, the gate and queries."""
        return self.state is ACTIVE

    def flush_caches(self) -> int:
        """Write every cached store entry out (the commit's step 0), until none is left: an
        entry forwarded on flush may write another store's cache downstream. How many."""
        flushed = total = 0
        while True:
            flushed = sum(store.flush_cache() for store in self.stores.values())
            if not flushed:
                return total
            total += flushed

    def forward_flushed(self, node: str, key: Any, value: Any) -> None:
        """Forward from ``node`` an entry leaving its store's cache: at a commit or an
        eviction, so with no input record's headers (as a punctuation's forwards)."""
        previous, headers = self._node, self._headers
        self._node, self._headers = node, ()
        try:
            self._forward_from(node, key, value, None)
        finally:
            self._node, self._headers = previous, headers

    def close(self) -> None:
        """Close the processors ``init`` created (none when it never ran), and forget what
        the stores' caches still hold: a task closed after its commit has flushed them, and
        one dropped without a commit leaves its records to be processed again (and what waited
        for its outputs' acknowledgement undone)."""
        self.after_acknowledged.clear()
        for store in self.stores.values():
            if store.cache is not None:
                store.cache.discard()
        for name, processor in self._processors.items():
            self._node = name
            try:
                processor.close()
            except Exception:
                logger.exception("processor close failed", extra={"task": str(self.id)})
        self._processors.clear()
        self._node = None

    def outputs_acknowledged(self) -> int:
        """Run what waited for the outputs produced so far to be acknowledged: the commit
        calls it once the producer's flush returned. How many actions ran."""
        actions, self.after_acknowledged = self.after_acknowledged, []
        for action in actions:
            try:
                action()
            except StreamsError:
                raise
            except Exception as error:
                raise self._failed("an action after the outputs' acknowledgement", error) from error
        return len(actions)

    def add(self, topic: str, record: Record) -> None:
        source = self._topology.source_of_topic(topic)
        self.inputs.add(topic, source.timestamp_extractor(record), record)

    def current_record(self) -> tuple[int, int] | None:
        """The key hash and offset of the record being processed, if one is (any thread)."""
        record = self._current
        return None if record is None else (key_hash(record.key, record.offset), record.offset)

    def process_next(self, now_ms: int) -> bool | Wait:
        """Process one record if one may go now: True when one did, False when none is
        buffered, a ``Wait`` when an empty input is being waited for."""
        choice = self.inputs.choose(now_ms)
        if choice is None or isinstance(choice, Wait):
            return False if choice is None else choice
        topic, buffered = choice
        record = buffered.record
        taken = self.taken.get(str(topic))
        if taken is None:
            taken = self.taken[str(topic)] = [0, 0]
        taken[0] += weight(record)
        taken[1] += 1
        source = self._topology.source_of_topic(str(topic))
        self._current = record
        self.metrics.last_record_timestamp = buffered.timestamp
        span = None if self.tracer is None else self._span(record)
        token = None if span is None else span.current()
        try:
            key = source.key_serde.deserialize(record.key)
            value = source.value_serde.deserialize(record.value)
            self._node = source.name
            headers = tuple(record.headers or ())
            # What the sinks produce carries this record's span on, not its producer's.
            self._headers = headers if span is None else span.headers(headers)
            self._forward_from(source.name, key, value, None)
        except BaseException as error:
            if span is not None:
                span.failed(error, "stopped")
                span.end("failed")
            raise
        finally:
            # Reset before the stream-time punctuations below: theirs forward no headers.
            self._node = None
            self._headers = ()
            if token is not None:
                RecordSpan.restore(token)
        if span is not None:
            span.end("processed")
        self.processed.append(record)
        self.metrics.records += 1
        self.punctuate(STREAM_TIME, self.inputs.stream_time)
        self._current = None
        return True

    def _span(self, record: Record) -> RecordSpan:
        assert self.tracer is not None
        hashed = key_hash(record.key, record.offset)
        return self.tracer.start(record.topic, record.partition, record, hashed)

    def punctuate(self, kind: PunctuationType, now_ms: int) -> int:
        fired = 0
        for schedule, at in self.punctuations.due(kind, now_ms):
            self._node = None
            try:
                schedule.callback(at)
            except StreamsError:
                raise
            except Exception as error:
                raise self._failed(f"a {kind.value} punctuation", error) from error
            fired += 1
        self.metrics.punctuations += fired
        return fired

    # ------------------------------------------------------------ for the context

    def forward(
        self, key: Any, value: Any, to: str | None, headers: Sequence[tuple[str, bytes]] | None
    ) -> None:
        if self._node is None:
            raise StreamsError("forward() outside process() or a punctuation of a processor")
        if headers is None:
            self._forward_from(self._node, key, value, to)
            return
        inherited, self._headers = self._headers, _checked(headers)
        try:
            self._forward_from(self._node, key, value, to)
        finally:
            self._headers = inherited

    def headers(self) -> Headers:
        return self._headers

    def current(self) -> Record | None:
        return self._current

    def current_node(self) -> str | None:
        return self._node

    def set_node(self, name: str | None) -> None:
        self._node = name

    def _forward_from(self, parent: str, key: Any, value: Any, to: str | None) -> None:
        routes = self._routes[parent]
        if to is not None:
            routes = tuple(route for route in routes if route[0] == to)
            if not routes:
                raise StreamsError(f"node '{parent}' has no child named '{to}'")
        for child, sink in routes:
            if sink is not None:
                self.outgoing.append(
                    Outgoing(
                        sink.topic,
                        None,
                        sink.key_serde.serialize(key),
                        sink.value_serde.serialize(value),
                        None,
                        self._headers,
                    )
                )
                continue
            previous = self._node
            self._node = child
            try:
                self._processors[child].process(key, value)
            except StreamsError:
                raise
            except Exception as error:
                raise self._failed(f"processor '{child}'", error) from error
            finally:
                self._node = previous

    def _failed(self, where: str, error: Exception) -> ProcessorFailed:
        record = self._current
        at = "" if record is None else f" on {record.topic}[{record.partition}]@{record.offset}"
        logger.error(
            "processing failed", exc_info=error, extra={"task": str(self.id), "where": where}
        )
        return ProcessorFailed(f"task {self.id}: {where} failed{at}: {error!r}")

    def _changelog_writer(self, store: str) -> Any:
        spec = self._topology.stores[store]
        topic = spec.changelog_topic(self.application_id)
        partition = self.id.partition
        if spec.source_topic is not None:
            # The store's changelog is its source topic, which holds these writes already.
            return _unlogged

        def write(key: bytes, value: bytes | None) -> None:
            self.outgoing.append(Outgoing(topic, partition, key, value, changelog_of=store))

        return write


def _unlogged(key: bytes, value: bytes | None) -> None:
    return None


def _task_store(
    spec: StoreSpec,
    backend: BytesStore,
    keys: KeyRange,
    changelog: ChangelogWrite,
    cache: CacheBudget | None,
) -> TaskStore | TaskWindowStore:
    if spec.windowed:
        if not isinstance(backend, WindowBackend):
            raise StreamsError(f"store '{spec.name}' is a window store on a key-value backend")
        return TaskWindowStore(spec, backend, [keys], changelog, cache)
    return TaskStore(spec, backend, [keys], changelog, cache)


def _checked(headers: Sequence[tuple[str, bytes]]) -> Headers:
    """The headers a processor passed, as a tuple; TypeError naming the first bad one, so the
    processor fails on its record rather than the producer on a batch later."""
    checked = tuple(headers)
    for header in checked:
        if not (
            isinstance(header, tuple)
            and len(header) == 2
            and isinstance(header[0], str)
            and isinstance(header[1], bytes)
        ):
            raise TypeError(f"a header is a (str, bytes) pair, not {header!r}")
    return checked


class TaskContext:
    """``ProcessorContext`` for one task (KIP-28's context)."""

    def __init__(self, task: StreamTask) -> None:
        self._task = task

    @property
    def application_id(self) -> str:
        return self._task.application_id

    @property
    def task_id(self) -> str:
        return str(self._task.id)

    @property
    def topic(self) -> str | None:
        record = self._task.current()
        return None if record is None else str(record.topic)

    @property
    def partition(self) -> int:
        return self._task.id.partition

    @property
    def offset(self) -> int:
        record = self._task.current()
        return -1 if record is None else int(record.offset)

    @property
    def timestamp(self) -> int:
        record = self._task.current()
        if record is None:
            return self._task.inputs.stream_time
        return self._task.metrics.last_record_timestamp

    @property
    def headers(self) -> Sequence[tuple[str, bytes]]:
        return self._task.headers()

    @property
    def stream_time(self) -> int:
        return self._task.inputs.stream_time

    def forward(
        self,
        key: Any,
        value: Any,
        to: str | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> None:
        self._task.forward(key, value, to, headers)

    def schedule(
        self, interval_ms: int, kind: PunctuationType, callback: Punctuator
    ) -> Cancellable:
        node = self._task.current_node()
        task = self._task

        def punctuate(at: int) -> None:
            task.set_node(node)
            try:
                callback(at)
            finally:
                task.set_node(None)

        if kind not in (STREAM_TIME, WALL_CLOCK):
            raise StreamsError(f"unknown punctuation type {kind!r}")
        return self._task.punctuations.schedule(interval_ms, kind, punctuate)

    def commit(self) -> None:
        self._task.commit_requested = True

    def after_outputs_acknowledged(self, action: Callable[[], None]) -> None:
        """See ``ProcessorContext.after_outputs_acknowledged``."""
        self._task.after_acknowledged.append(action)

    def state_store(self, name: str) -> KeyValueStore:
        store = self._task.stores.get(name)
        if store is None:
            raise UnknownStore(f"store '{name}' is not connected to task {self._task.id}")
        if isinstance(store, TaskWindowStore):
            raise UnknownStore(f"store '{name}' is a window store: ask window_store() for it")
        return store

    def forward_on_flush(self, name: str) -> bool:
        """See ``ProcessorContext.forward_on_flush``."""
        store = self.state_store(name)
        if not isinstance(store, TaskStore) or store.cache is None:
            return False
        node = self._task.current_node()
        if node is None:
            raise StreamsError("forward_on_flush() outside a processor's init or process")
        task = self._task

        def forward(key: Any, value: Any) -> None:
            task.forward_flushed(node, key, value)

        store.flush_listener = forward
        return True

    def window_store(self, name: str) -> WindowStore:
        store = self._task.stores.get(name)
        if store is None:
            raise UnknownStore(f"store '{name}' is not connected to task {self._task.id}")
        if not isinstance(store, TaskWindowStore):
            raise UnknownStore(f"store '{name}' is a key-value store: ask state_store() for it")
        return store
