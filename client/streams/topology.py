"""The topology builder (KIP-28): sources, processors, sinks and state stores, checked when
``build()`` runs, with an error that names the node at fault.

``build()`` also splits the graph into sub-topologies: nodes connected by edges or by a
shared store. The topics of one sub-topology's sources form its partition group: partition
``p`` of each of them, restricted to one key range, is one task's input (co-partitioning).
Pure: nothing here touches Kafka.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from client.streams.errors import TopologyError
from client.streams.processor import Processor
from client.streams.serde import BYTES, Serde

TimestampExtractor = Callable[[Any], int]
ProcessorSupplier = Callable[[], Processor]

# Kafka's legal topic characters, which changelog names are built from.
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def record_timestamp(record: Any) -> int:
    """The default extractor: the record's own timestamp (producer or log append time)."""
    return int(record.timestamp)


@dataclass(frozen=True)
class SourceNode:
    name: str
    topics: tuple[str, ...]
    key_serde: Serde
    value_serde: Serde
    timestamp_extractor: TimestampExtractor


@dataclass(frozen=True)
class ProcessorNode:
    name: str
    supplier: ProcessorSupplier
    parents: tuple[str, ...]


@dataclass(frozen=True)
class SinkNode:
    name: str
    topic: str
    parents: tuple[str, ...]
    key_serde: Serde
    value_serde: Serde


@dataclass(frozen=True)
class StoreSpec:
    """A key-value store: ``persistent`` keeps it on disk (RocksDB, the ``streams`` extra),
    otherwise in memory; either way every write goes to its changelog topic.

    ``retention_ms`` makes it a window store (``client.streams.windows``): windows kept by
    stream time for that long after their end, in segments of ``segment_ms`` (default half
    the retention, at least a minute). ``source_topic`` makes a compacted source topic the
    store's changelog (a table read from a topic): restoration reads that topic and nothing
    is written to it.
    """

    name: str
    key_serde: Serde = BYTES
    value_serde: Serde = BYTES
    persistent: bool = False
    retention_ms: int | None = None
    segment_ms: int | None = None
    source_topic: str | None = None

    @property
    def windowed(self) -> bool:
        return self.retention_ms is not None

    def changelog_topic(self, application_id: str) -> str:
        if self.source_topic is not None:
            return self.source_topic
        return f"{application_id}-{self.name}-changelog"


@dataclass(frozen=True)
class SubTopology:
    """One connected part of the graph; its source topics are co-partitioned."""

    index: int
    source_topics: tuple[str, ...]
    nodes: tuple[str, ...]
    stores: tuple[str, ...]


@dataclass(frozen=True)
class BuiltTopology:
    """A checked topology: what the runtime instantiates once per task."""

    sources: dict[str, SourceNode]
    processors: dict[str, ProcessorNode]
    sinks: dict[str, SinkNode]
    stores: dict[str, StoreSpec]
    store_users: dict[str, tuple[str, ...]]
    children: dict[str, tuple[str, ...]]
    subtopologies: tuple[SubTopology, ...]
    # Topics the application creates and owns (a re-keying's repartition topic), by the name
    # the topology gives them, with their partition count (None: as many as the
    # sub-topology writing them reads); ``client.streams.internal`` prefixes the names with
    # the application id.
    internal_topics: dict[str, int | None] = field(default_factory=dict)

    @property
    def source_topics(self) -> list[str]:
        return sorted({topic for source in self.sources.values() for topic in source.topics})

    def source_of_topic(self, topic: str) -> SourceNode:
        source = self._source_by_topic.get(topic)
        if source is None:
            raise TopologyError(f"no source reads topic '{topic}'")
        return source

    def subtopology_of_topic(self, topic: str) -> SubTopology:
        sub = self._subtopology_by_topic.get(topic)
        if sub is None:
            raise TopologyError(f"no sub-topology reads topic '{topic}'")
        return sub

    # Both asked for every record (its task, its source): dicts made once, not scans.
    @cached_property
    def _source_by_topic(self) -> dict[str, SourceNode]:
        found: dict[str, SourceNode] = {}
        for source in self.sources.values():
            for topic in source.topics:
                found.setdefault(topic, source)
        return found

    @cached_property
    def _subtopology_by_topic(self) -> dict[str, SubTopology]:
        found: dict[str, SubTopology] = {}
        for sub in self.subtopologies:
            for topic in sub.source_topics:
                found.setdefault(topic, sub)
        return found


@dataclass
class Topology:
    """Build a processing graph; each ``add_*`` returns the builder, ``build()`` checks it.

    Parents must be added before their children, so the graph has no cycles by
    construction, as in Kafka Streams.
    """

    _sources: dict[str, SourceNode] = field(default_factory=dict)
    _processors: dict[str, ProcessorNode] = field(default_factory=dict)
    _sinks: dict[str, SinkNode] = field(default_factory=dict)
    _stores: dict[str, StoreSpec] = field(default_factory=dict)
    _store_users: dict[str, list[str]] = field(default_factory=dict)
    _order: list[str] = field(default_factory=list)
    _internal: dict[str, int | None] = field(default_factory=dict)

    def add_source(
        self,
        name: str,
        *topics: str,
        key_serde: Serde = BYTES,
        value_serde: Serde = BYTES,
        timestamp_extractor: TimestampExtractor = record_timestamp,
    ) -> Topology:
        self._new_name(name, "source")
        if not topics:
            raise TopologyError(f"source '{name}' reads no topic")
        for topic in topics:
            if not _NAME.match(topic):
                raise TopologyError(f"source '{name}': '{topic}' is not a valid topic name")
            for other in self._sources.values():
                if topic in other.topics:
                    raise TopologyError(
                        f"source '{name}': topic '{topic}' is already read by source '{other.name}'"
                    )
        _check_serdes(f"source '{name}'", key_serde, value_serde)
        if not callable(timestamp_extractor):
            raise TopologyError(f"source '{name}': the timestamp extractor is not callable")
        self._sources[name] = SourceNode(
            name, tuple(topics), key_serde, value_serde, timestamp_extractor
        )
        self._order.append(name)
        return self

    def add_processor(self, name: str, supplier: ProcessorSupplier, *parents: str) -> Topology:
        self._new_name(name, "processor")
        if not callable(supplier):
            raise TopologyError(f"processor '{name}': its supplier is not callable")
        self._check_parents(name, "processor", parents)
        self._processors[name] = ProcessorNode(name, supplier, tuple(parents))
        self._order.append(name)
        return self

    def add_sink(
        self,
        name: str,
        topic: str,
        *parents: str,
        key_serde: Serde = BYTES,
        value_serde: Serde = BYTES,
    ) -> Topology:
        self._new_name(name, "sink")
        if not _NAME.match(topic):
            raise TopologyError(f"sink '{name}': '{topic}' is not a valid topic name")
        self._check_parents(name, "sink", parents)
        _check_serdes(f"sink '{name}'", key_serde, value_serde)
        self._sinks[name] = SinkNode(name, topic, tuple(parents), key_serde, value_serde)
        self._order.append(name)
        return self

    def add_internal_topic(self, topic: str, partitions: int | None = None) -> Topology:
        """Declare a topic the application creates and owns (named ``<application id>-<topic>``
        when it runs), for sinks and sources of this topology to use by ``topic``."""
        if not _NAME.match(topic):
            raise TopologyError(f"internal topic '{topic}' is not a valid topic name")
        if topic in self._internal:
            raise TopologyError(f"internal topic '{topic}' is declared twice")
        if partitions is not None and partitions < 1:
            raise TopologyError(f"internal topic '{topic}': partitions must be at least 1")
        self._internal[topic] = partitions
        return self

    def add_state_store(self, spec: StoreSpec, *processor_names: str) -> Topology:
        if not _NAME.match(spec.name):
            raise TopologyError(f"store '{spec.name}': names use letters, digits, '.', '_', '-'")
        if spec.name in self._stores:
            raise TopologyError(f"store '{spec.name}' is added twice")
        _check_serdes(f"store '{spec.name}'", spec.key_serde, spec.value_serde)
        if spec.retention_ms is not None and spec.retention_ms < 1:
            raise TopologyError(f"store '{spec.name}': retention_ms must be at least 1")
        if spec.source_topic is not None and spec.windowed:
            raise TopologyError(f"store '{spec.name}': a window store cannot be a source topic's")
        for processor in processor_names:
            if processor not in self._processors:
                raise TopologyError(
                    f"store '{spec.name}': '{processor}' is not a processor of this topology"
                )
        self._stores[spec.name] = spec
        self._store_users[spec.name] = list(processor_names)
        return self

    def connect_store(self, store: str, *processor_names: str) -> Topology:
        if store not in self._stores:
            raise TopologyError(f"store '{store}' is not added to this topology")
        for processor in processor_names:
            if processor not in self._processors:
                raise TopologyError(
                    f"store '{store}': '{processor}' is not a processor of this topology"
                )
            self._store_users[store].append(processor)
        return self

    def build(self) -> BuiltTopology:
        if not self._sources:
            raise TopologyError("the topology has no source")
        children: dict[str, list[str]] = {name: [] for name in self._order}
        edges = [(node.name, node.parents) for node in self._processors.values()]
        edges += [(node.name, node.parents) for node in self._sinks.values()]
        for name, parents in edges:
            for parent in parents:
                children[parent].append(name)
        for name, spec_users in self._store_users.items():
            if not spec_users:
                raise TopologyError(f"store '{name}' is connected to no processor")
        for source in self._sources.values():
            if not children[source.name]:
                raise TopologyError(f"source '{source.name}' has no child: its records go nowhere")
        for spec in self._stores.values():
            if spec.source_topic is not None and not any(
                spec.source_topic in source.topics for source in self._sources.values()
            ):
                raise TopologyError(
                    f"store '{spec.name}': its changelog '{spec.source_topic}' is no source's topic"
                )
        subtopologies = self._subtopologies(children)
        # What is known before the topics are: the counts internal topics were declared with.
        # ``client.streams.internal.plan_internal_topics`` checks the rest at start-up.
        for sub in subtopologies:
            check_copartitioned(
                {
                    topic: count
                    for topic in sub.source_topics
                    if (count := self._internal.get(topic)) is not None
                }
            )
        return BuiltTopology(
            sources=dict(self._sources),
            processors=dict(self._processors),
            sinks=dict(self._sinks),
            stores=dict(self._stores),
            store_users={name: tuple(users) for name, users in self._store_users.items()},
            children={name: tuple(kids) for name, kids in children.items()},
            subtopologies=subtopologies,
            internal_topics=dict(self._internal),
        )

    def _subtopologies(self, children: dict[str, list[str]]) -> tuple[SubTopology, ...]:
        parent_of = {name: name for name in self._order}

        def root(name: str) -> str:
            while parent_of[name] != name:
                parent_of[name] = parent_of[parent_of[name]]
                name = parent_of[name]
            return name

        def join(left: str, right: str) -> None:
            parent_of[root(left)] = root(right)

        for name, kids in children.items():
            for kid in kids:
                join(name, kid)
        for users in self._store_users.values():
            for user in users[1:]:
                join(users[0], user)
        groups: dict[str, list[str]] = {}
        for name in self._order:
            groups.setdefault(root(name), []).append(name)
        result = []
        for index, nodes in enumerate(groups.values()):
            members = set(nodes)
            topics = tuple(
                topic
                for name in nodes
                if name in self._sources
                for topic in self._sources[name].topics
            )
            stores = tuple(
                store for store, users in self._store_users.items() if members.intersection(users)
            )
            result.append(SubTopology(index, topics, tuple(nodes), stores))
        return tuple(result)

    def _new_name(self, name: str, kind: str) -> None:
        if not isinstance(name, str) or not name:
            raise TopologyError(f"a {kind} needs a non-empty name")
        if name in self._order:
            raise TopologyError(f"{kind} '{name}': the name is already used by another node")

    def _check_parents(self, name: str, kind: str, parents: tuple[str, ...]) -> None:
        if not parents:
            raise TopologyError(f"{kind} '{name}' has no parent")
        for parent in parents:
            if parent in self._sinks:
                raise TopologyError(f"{kind} '{name}': parent '{parent}' is a sink")
            if parent not in self._order:
                raise TopologyError(
                    f"{kind} '{name}': parent '{parent}' is not a node added before it"
                )
        if len(set(parents)) != len(parents):
            raise TopologyError(f"{kind} '{name}' names a parent twice")


def check_copartitioned(counts: dict[str, int]) -> None:
    """Topics read partition by partition together (one sub-topology's inputs: a join, a
    shared store) need one partition count: the assignor hands out only the partitions every
    one of them has, so the rest would never be read."""
    if len(set(counts.values())) > 1:
        named = ", ".join(f"'{topic}' has {count}" for topic, count in sorted(counts.items()))
        raise TopologyError(
            "topics read together (joined, or sharing a store) are not co-partitioned: "
            f"{named} partitions; give them one partition count, or re-key one side through "
            "a repartition topic"
        )


def _check_serdes(owner: str, *serdes: Serde) -> None:
    for serde in serdes:
        if not (
            callable(getattr(serde, "serialize", None))
            and callable(getattr(serde, "deserialize", None))
        ):
            raise TopologyError(f"{owner}: {serde!r} is not a serde (serialize/deserialize)")
