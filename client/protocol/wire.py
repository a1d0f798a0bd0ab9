"""The slice wire codec (docs/api.md): a member's slices as JSON, one entry per partition with
its key ranges as closed pairs, ``{"topic": t, "partition": p, "ranges": [[start, end], ...]}``.

Both sides encode and decode here, over key ranges by partition; the coordinator's ``Slice``
tuples and the client's slice maps convert to and from that. Encoding takes normalized ranges
and sorts the partitions, and decoding normalizes, so two encodings of the same hashes are
equal as JSON (the coordinator stores them and compares by plain equality).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from client.protocol.keyspace import KeyRange, normalize

TopicPartition = tuple[str, int]
RangesByPartition = dict[TopicPartition, list[KeyRange]]


def ranges_to_wire(
    ranges_by_partition: Mapping[TopicPartition, Iterable[KeyRange]],
) -> list[dict[str, Any]]:
    """Encode ranges the caller has normalized (``keyspace.normalize``): the coordinator's
    always are, and normalizing again on every heartbeat's write would be work done twice."""
    encoded = []
    for (topic, partition), ranges in sorted(ranges_by_partition.items()):
        pairs = [keys.to_json() for keys in ranges]
        if pairs:
            encoded.append({"topic": topic, "partition": partition, "ranges": pairs})
    return encoded


def ranges_from_wire(entries: Iterable[Mapping[str, Any]]) -> RangesByPartition:
    """Parse and normalize wire slices; ``ValueError`` on a malformed entry.

    A missing, null or empty ``ranges`` means the whole partition, as in the KIP's
    ``assign(Map<TopicPartition, List<KeyRange>>)`` ("an empty list means full ownership").
    """
    collected: RangesByPartition = {}
    for entry in entries:
        topic, partition = entry.get("topic"), entry.get("partition")
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"a slice needs a topic name, got {topic!r}")
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            raise ValueError(f"a slice needs a partition >= 0, got {partition!r}")
        pairs = entry.get("ranges") or [KeyRange.full().to_json()]
        if not isinstance(pairs, list):
            raise ValueError(f"slice ranges must be a list of [start, end] pairs, got {pairs!r}")
        collected.setdefault((topic, partition), []).extend(
            KeyRange.from_json(pair) for pair in pairs
        )
    return {tp: normalize(ranges) for tp, ranges in sorted(collected.items())}
