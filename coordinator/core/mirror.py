"""What the offset mirror writes to Kafka (coordinator/mirror.py), decided without I/O: the
Kafka group a Keyrange group mirrors into, the offsets that differ from what Kafka holds,
and which refusals were already named in the log."""

from __future__ import annotations

from collections.abc import Mapping

TopicPartition = tuple[str, int]

# Written as each mirrored offset's metadata, so an operator reading the Kafka group sees
# who committed it.
MIRROR_METADATA = "keyrange-mirror"


def kafka_group_name(prefix: str, group_id: str) -> str:
    return f"{prefix}{group_id}"


def offsets_to_mirror(
    stored: Mapping[TopicPartition, int], in_kafka: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """The stored stable offsets Kafka does not hold yet. Compared with what Kafka holds now,
    not with what this replica wrote last: another replica, an offset reset, or a restart
    may have changed either side since."""
    return {tp: offset for tp, offset in stored.items() if in_kafka.get(tp) != offset}


class SkippedGroups:
    """The Kafka groups the mirror could not write, each named in the log once until it
    can write it again, so a group that real Kafka consumers use is one WARNING, not one
    per refresh."""

    def __init__(self) -> None:
        self._named: set[str] = set()

    def first_time(self, group: str) -> bool:
        """True when ``group`` was not skipped since it was last written."""
        if group in self._named:
            return False
        self._named.add(group)
        return True

    def written(self, group: str) -> None:
        self._named.discard(group)
