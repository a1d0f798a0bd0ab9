"""Internal topics: the topics an application creates and owns (a re-keying's repartition
topic), named ``<application id>-<name>`` as in Kafka Streams, so two applications built from
one topology never share one. Pure: the app creates what ``plan_internal_topics`` lists.
"""

from __future__ import annotations

from dataclasses import replace

from client.streams.errors import TopologyError
from client.streams.topology import BuiltTopology, StoreSpec, SubTopology, check_copartitioned


def internal_name(application_id: str, topic: str) -> str:
    return f"{application_id}-{topic}"


def for_application(topology: BuiltTopology, application_id: str) -> BuiltTopology:
    """The topology with its internal topics renamed for ``application_id``; the same
    topology when it has none (or was resolved already)."""
    if not topology.internal_topics:
        return topology
    names = {topic: internal_name(application_id, topic) for topic in topology.internal_topics}

    def rename(topic: str) -> str:
        return names.get(topic, topic)

    return replace(
        topology,
        sources={
            name: replace(node, topics=tuple(rename(topic) for topic in node.topics))
            for name, node in topology.sources.items()
        },
        sinks={
            name: replace(node, topic=rename(node.topic)) for name, node in topology.sinks.items()
        },
        subtopologies=tuple(
            replace(sub, source_topics=tuple(rename(topic) for topic in sub.source_topics))
            for sub in topology.subtopologies
        ),
        internal_topics={names[topic]: count for topic, count in topology.internal_topics.items()},
    )


def external_topics(topology: BuiltTopology) -> list[str]:
    """The source topics that must exist before the application starts."""
    return [topic for topic in topology.source_topics if topic not in topology.internal_topics]


def plan_internal_topics(topology: BuiltTopology, partitions: dict[str, int]) -> dict[str, int]:
    """Each internal topic's partition count, checking co-partitioning (Kafka Streams'
    rules, which it checks at start-up as this is): a sub-topology's input topics are read
    partition by partition together (a join, a shared store), so they must have one count.
    Its external topics must agree, or ``TopologyError`` names them with their counts; an
    internal topic it reads takes their count (a re-keyed stream joined with a table on 3
    partitions is repartitioned into 3, whatever the stream's topic has), and one declared
    with another count is refused. A sub-topology reading internal topics only gives them
    their declared count, or else the largest of the topics their writers read.
    ``partitions`` holds the external topics' counts; the plan is added to it too, as the
    app reads it afterwards."""
    planned: dict[str, int] = {}
    groups = [sub.source_topics for sub in topology.subtopologies]
    # Internal topics no sub-topology reads are sized by their writers alone.
    read = {topic for topics in groups for topic in topics}
    groups += [(topic,) for topic in topology.internal_topics if topic not in read]
    pending = list(groups)
    while pending:
        progressed = False
        for topics in list(pending):
            count = _group_count(topology, topics, partitions)
            if count is None:
                continue
            for topic in topics:
                if topic in topology.internal_topics:
                    planned[topic] = partitions[topic] = count
            pending.remove(topics)
            progressed = True
        if not progressed:
            unsized = sorted(
                topic for topics in pending for topic in topics if topic in topology.internal_topics
            )
            raise TopologyError(
                f"cannot size internal topics {unsized}: no sub-topology writing them "
                "reads a topic of known size"
            )
    return planned


def _group_count(
    topology: BuiltTopology, topics: tuple[str, ...], partitions: dict[str, int]
) -> int | None:
    """The partition count of one group of co-partitioned topics (None: not known yet, as a
    writer's own input is not sized); raises ``TopologyError`` when they cannot agree."""
    internal = topology.internal_topics
    external = {topic: partitions[topic] for topic in topics if topic not in internal}
    declared = {topic: count for topic in topics if (count := internal.get(topic)) is not None}
    check_copartitioned(external)
    check_copartitioned({**external, **declared})
    if external or declared:
        return next(iter({**external, **declared}.values()))
    writers: list[int] = []
    for topic in topics:
        counts = [partitions.get(source) for source in _read_by_writers(topology, topic)]
        if not counts or any(known is None for known in counts):
            return None
        writers.extend(known for known in counts if known is not None)
    return max(writers)


def _read_by_writers(topology: BuiltTopology, topic: str) -> list[str]:
    writers: list[SubTopology] = [
        sub
        for sub in topology.subtopologies
        if any(topology.sinks[node].topic == topic for node in sub.nodes if node in topology.sinks)
    ]
    return [source for sub in writers for source in sub.source_topics]


# Kafka Streams' ``windowstore.changelog.additional.retention.ms``: a window store's
# changelog keeps its records this much longer than the store keeps their windows, as the
# broker counts time by the wall clock and the store by stream time.
WINDOW_CHANGELOG_EXTRA_RETENTION_MS = 24 * 60 * 60 * 1000


def changelog_configs(spec: StoreSpec) -> dict[str, str] | None:
    """The topic configs of the changelog the app creates for ``spec``; None when it creates
    none (the store's changelog is a source topic). A window store's changelog is keyed by
    the record key (so the restore's key-range filter applies unchanged) and carries every
    window of a key: compaction would keep one, so its records expire by time instead."""
    if spec.source_topic is not None:
        return None
    if spec.retention_ms is not None:
        retention = spec.retention_ms + WINDOW_CHANGELOG_EXTRA_RETENTION_MS
        return {"cleanup.policy": "delete", "retention.ms": str(retention)}
    return {"cleanup.policy": "compact"}
