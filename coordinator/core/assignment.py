"""Value types shared by the assignors and the reconciliation step (docs/design.md §5-6).

Shaped like Kafka's server-side assignor API (``GroupSpec -> GroupAssignment``): read-only
inputs, a plain mapping out, no I/O, so the coordinator can run them inside a transaction and
tests can build groups by hand. A slice is one ``(topic, partition, KeyRange)``; collections of
slices are kept *normalized* (per partition the key ranges sorted, disjoint and non-adjacent,
partitions in sorted order) so two assignments compare equal exactly when they cover the same
hashes, which is what epoch bumps and "did anything move" questions need.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from client.protocol.keyspace import HASH_SPACE, KeyRange, intersect, normalize, subtract
from client.protocol.wire import ranges_from_wire, ranges_to_wire

TopicPartition = tuple[str, int]


@dataclass(frozen=True, order=True, slots=True)
class Slice:
    topic: str
    partition: int
    keys: KeyRange

    @classmethod
    def whole(cls, topic: str, partition: int) -> Slice:
        return cls(topic, partition, KeyRange.full())

    @property
    def topic_partition(self) -> TopicPartition:
        return (self.topic, self.partition)

    @property
    def is_whole(self) -> bool:
        return self.keys == KeyRange.full()


@dataclass(frozen=True, slots=True)
class MemberSpec:
    """One member as an assignor sees it.

    ``owned`` is what stickiness should preserve: the coordinator passes the member's previous
    target (the assignor's own last output, disjoint by construction) rather than what the member
    reported, which lags behind by a heartbeat. ``standbys`` are the key ranges the member
    reports keeping warm copies of (a streams instance's standbys): an assignor may prefer it
    for them when they move, never at the price of balance; they may overlap other members'.
    """

    member_id: str
    subscribed_topics: frozenset[str]
    allow_individual_commit: bool = True
    owned: tuple[Slice, ...] = ()
    member_epoch: int = 0
    instance_id: str | None = None
    standbys: tuple[Slice, ...] = ()

    @property
    def order_key(self) -> tuple[int, str, str]:
        """Static members first, by instance id, then dynamic ones by member id (as Kafka's
        assignors sort), so a static member that restarts under a new member id keeps its
        place in round-robin and range assignments."""
        if self.instance_id is not None:
            return (0, self.instance_id, self.member_id)
        return (1, self.member_id, "")


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partition_count: int
    accept_range_fetch: bool = False


@dataclass(frozen=True)
class GroupSpec:
    members: Mapping[str, MemberSpec]
    topics: Mapping[str, TopicSpec]
    accept_individual_commit: bool = True
    # Derived once: assignors ask for members in this order many times per topic.
    ordered_members: tuple[MemberSpec, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ordered = tuple(sorted(self.members.values(), key=lambda member: member.order_key))
        object.__setattr__(self, "ordered_members", ordered)

    @classmethod
    def of(
        cls,
        members: Iterable[MemberSpec],
        topics: Iterable[TopicSpec],
        *,
        accept_individual_commit: bool = True,
    ) -> GroupSpec:
        return cls(
            {member.member_id: member for member in members},
            {topic.name: topic for topic in topics},
            accept_individual_commit,
        )

    def can_split(self, topic: str) -> bool:
        """A partition may be shared by key only if the coordinator and the topic both allow it
        (docs/design.md §4); whether a member takes part is the member's own switch."""
        spec = self.topics.get(topic)
        return self.accept_individual_commit and spec is not None and spec.accept_range_fetch

    def subscribers(self, topic: str) -> list[MemberSpec]:
        return [member for member in self.ordered_members if topic in member.subscribed_topics]

    def assignable_topics(self) -> list[TopicSpec]:
        return sorted(
            (topic for topic in self.topics.values() if topic.partition_count > 0),
            key=lambda topic: topic.name,
        )


GroupAssignment = Mapping[str, tuple[Slice, ...]]


# Slice-set algebra, key-range granular: a member may hold part of a partition.


def _normalized(ranges: Iterable[KeyRange]) -> list[KeyRange]:
    # Most partitions carry one range per member; skip the sort for those (large groups
    # normalize tens of thousands of them per assignment).
    if isinstance(ranges, list | tuple) and len(ranges) < 2:
        return list(ranges)
    return normalize(ranges)


def ranges_by_partition(slices: Iterable[Slice]) -> dict[TopicPartition, list[KeyRange]]:
    """Per partition, the normalized key ranges the slices cover."""
    grouped: dict[TopicPartition, list[KeyRange]] = defaultdict(list)
    for piece in slices:
        grouped[piece.topic_partition].append(piece.keys)
    return {tp: _normalized(ranges) for tp, ranges in grouped.items()}


def slices_from_ranges(ranges: Mapping[TopicPartition, Iterable[KeyRange]]) -> tuple[Slice, ...]:
    return tuple(
        Slice(topic, partition, keys)
        for (topic, partition) in sorted(ranges)
        for keys in _normalized(ranges[(topic, partition)])
    )


def normalize_slices(slices: Iterable[Slice]) -> tuple[Slice, ...]:
    return slices_from_ranges(ranges_by_partition(slices))


def union_slices(*collections: Iterable[Slice]) -> tuple[Slice, ...]:
    return normalize_slices(piece for collection in collections for piece in collection)


def intersect_slices(left: Iterable[Slice], right: Iterable[Slice]) -> tuple[Slice, ...]:
    right_ranges = ranges_by_partition(right)
    return slices_from_ranges(
        {
            tp: intersect(ranges, right_ranges[tp])
            for tp, ranges in ranges_by_partition(left).items()
            if tp in right_ranges
        }
    )


def subtract_slices(left: Iterable[Slice], removed: Iterable[Slice]) -> tuple[Slice, ...]:
    removed_ranges = ranges_by_partition(removed)
    return slices_from_ranges(
        {
            tp: subtract(ranges, removed_ranges.get(tp, ()))
            for tp, ranges in ranges_by_partition(left).items()
        }
    )


# Wire shape: the kernel's codec (client/protocol/wire.py), over Slice tuples.


def slices_to_wire(slices: Iterable[Slice]) -> list[dict[str, Any]]:
    return ranges_to_wire(ranges_by_partition(slices))


def slices_from_wire(entries: Iterable[Mapping[str, Any]]) -> tuple[Slice, ...]:
    """Parse and normalize wire slices; ``ValueError`` on a malformed entry. The decoder
    returns partitions sorted and ranges normalized, so they become slices as they are."""
    return tuple(
        Slice(topic, partition, keys)
        for (topic, partition), ranges in ranges_from_wire(entries).items()
        for keys in ranges
    )


# Quality measures (docs/design.md §6): loads are in partition units, 1.0 = one whole partition.


def hash_count(slices: Iterable[Slice]) -> int:
    return sum(keys.size for ranges in ranges_by_partition(slices).values() for keys in ranges)


def member_loads(assignment: GroupAssignment) -> dict[str, float]:
    return {member: hash_count(slices) / HASH_SPACE for member, slices in assignment.items()}


def balance(assignment: GroupAssignment, group: GroupSpec) -> float:
    """The largest ``max - min`` load among members that could have been given the same work.

    Members are compared within the same subscription *and* the same
    ``allow_individual_commit``: a whole-only member stands by on purpose while sharers
    outnumber the partitions, so mixing the two would measure that decision, not imbalance.
    """
    loads = member_loads(assignment)
    classes: dict[tuple[frozenset[str], bool], list[float]] = defaultdict(list)
    for member_id, member in group.members.items():
        key = (member.subscribed_topics, member.allow_individual_commit)
        classes[key].append(loads.get(member_id, 0.0))
    return max((max(values) - min(values) for values in classes.values()), default=0.0)


def moved_hash_count(before: GroupAssignment, after: GroupAssignment) -> int:
    """Hashes that a member holds in ``after`` but did not hold in ``before``: every hash whose
    owner changed (including hashes a departed member held) counts once."""
    return sum(
        hash_count(subtract_slices(slices, before.get(member, ())))
        for member, slices in after.items()
    )


def moved_fraction(before: GroupAssignment, after: GroupAssignment) -> float:
    """Moved hashes as a fraction of everything assigned in ``after``."""
    total = sum(hash_count(slices) for slices in after.values())
    return moved_hash_count(before, after) / total if total else 0.0
