"""Range key-range split assignor (docs/design.md §6, the proposal's range variant)."""

from __future__ import annotations

from coordinator.core.assignment import GroupAssignment, GroupSpec, MemberSpec, TopicSpec
from coordinator.core.assignors.base import (
    AssignmentBuilder,
    assign_topic_by_topic,
    even_split,
    share_counts,
)


class RangeAssignor:
    """Gives each member a contiguous block per topic; shares a partition by key when members
    outnumber partitions.

    Properties, in priority order: coverage (every partition of every subscribed topic is
    assigned whole, exactly once, to its subscribers) > co-location (per topic the blocks
    follow member order, so topics with equal partition counts put the same partition numbers
    and the same key ranges on the same member, as Kafka's RangeAssignor does for joins) >
    balance *per topic* (loads on one topic differ by at most one slice; across topics the
    first members collect the extras, the price of co-location) > stickiness (none; use
    ``sticky-join``).

    Per topic, members ordered by ``MemberSpec.order_key``:
    - *Split*, when the coordinator accepts individual commits, the topic accepts range fetch,
      and the members that allow individual commit ("sharers") outnumber the partitions:
      partition p gets the next block of sharers (``ceil`` or ``floor`` of sharers/partitions,
      the bigger blocks first) and its hash space is split evenly among them, in order. With 5
      sharers and topics of 2 and 3 partitions: t1p0: c1,c2,c3 / t1p1: c4,c5 and t2p0: c1,c2 /
      t2p1: c3,c4 / t2p2: c5. Members that do not allow individual commit stand by on this
      topic for the reason given in ``RoundRobinAssignor``.
    - *Whole*, otherwise: Kafka's range assignment, member i taking the next
      ``partitions // members`` (+1 for the first ``partitions % members``) partitions.
    """

    name = "range"

    def assign(self, group: GroupSpec) -> GroupAssignment:
        return assign_topic_by_topic(group, split=_blocks_of_members, whole=_blocks_of_partitions)


def _blocks_of_members(
    builder: AssignmentBuilder, topic: TopicSpec, sharers: list[MemberSpec]
) -> None:
    start = 0
    for partition, count in enumerate(share_counts(len(sharers), topic.partition_count)):
        block = sharers[start : start + count]
        for member, keys in zip(block, even_split(count), strict=True):
            builder.add(member.member_id, topic.name, partition, keys)
        start += count


def _blocks_of_partitions(
    builder: AssignmentBuilder, topic: TopicSpec, members: list[MemberSpec]
) -> None:
    start = 0
    for member, count in zip(
        members, share_counts(topic.partition_count, len(members)), strict=True
    ):
        for partition in range(start, start + count):
            builder.add_whole(member.member_id, topic.name, partition)
        start += count
