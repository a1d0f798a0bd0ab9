"""The assignor interface and the building blocks the key-range assignors share."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Protocol

from client.protocol.keyspace import KeyRange
from coordinator.core.assignment import (
    GroupAssignment,
    GroupSpec,
    MemberSpec,
    Slice,
    TopicPartition,
    TopicSpec,
    slices_from_ranges,
)


class Assignor(Protocol):
    """Computes a target assignment: every member of ``group`` appears in the result (idle
    members with no slices), the slices of different members never overlap, and the same
    input always gives the same output."""

    name: str

    def assign(self, group: GroupSpec) -> GroupAssignment: ...


@lru_cache(maxsize=4096)
def even_split(parts: int) -> tuple[KeyRange, ...]:
    """The hash space in ``parts`` contiguous ranges (docs/design.md §2); cached because every
    partition of a big group is split the same few ways."""
    return tuple(KeyRange.full().split(parts))


class AssignmentBuilder:
    """Collects key ranges per member and partition and keeps each member's load (in hashes)
    current, so load-aware assignors can ask for it while they deal."""

    def __init__(self, member_ids: Iterable[str]) -> None:
        self._ranges: dict[str, dict[TopicPartition, list[KeyRange]]] = {
            member_id: {} for member_id in member_ids
        }
        self._load = dict.fromkeys(self._ranges, 0)

    def add(self, member_id: str, topic: str, partition: int, keys: KeyRange) -> None:
        self._ranges[member_id].setdefault((topic, partition), []).append(keys)
        self._load[member_id] += keys.size

    def add_whole(self, member_id: str, topic: str, partition: int) -> None:
        self.add(member_id, topic, partition, KeyRange.full())

    def load(self, member_id: str) -> int:
        return self._load[member_id]

    def build(self) -> dict[str, tuple[Slice, ...]]:
        return {
            member_id: slices_from_ranges(self._ranges[member_id])
            for member_id in sorted(self._ranges)
        }


def share_counts(members: int, partitions: int) -> list[int]:
    """Members per partition when ``members`` are spread over ``partitions`` as evenly as
    possible, the extra ones on the lowest partitions (the proposal's reverse assignment)."""
    base, extra = divmod(members, partitions)
    return [base + (1 if partition < extra else 0) for partition in range(partitions)]


TopicDealer = Callable[[AssignmentBuilder, TopicSpec, list[MemberSpec]], None]


def assign_topic_by_topic(
    group: GroupSpec, *, split: TopicDealer, whole: TopicDealer
) -> GroupAssignment:
    """The eligibility rule every key-range assignor shares: a topic's partitions are split
    among the members that allow sharing only when the switches allow it and those members
    outnumber the partitions; otherwise every subscriber takes whole partitions."""
    builder = AssignmentBuilder(group.members)
    for topic in group.assignable_topics():
        subscribers = group.subscribers(topic.name)
        sharers = [member for member in subscribers if member.allow_individual_commit]
        if group.can_split(topic.name) and len(sharers) > topic.partition_count:
            split(builder, topic, sharers)
        elif subscribers:
            whole(builder, topic, subscribers)
    return builder.build()
