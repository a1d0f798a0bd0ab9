"""Round-robin key-range split assignor (docs/design.md §6; the proposal's KeyRange round robin)."""

from __future__ import annotations

from coordinator.core.assignment import GroupAssignment, GroupSpec, MemberSpec, TopicSpec
from coordinator.core.assignors.base import (
    AssignmentBuilder,
    assign_topic_by_topic,
    even_split,
    share_counts,
)


class RoundRobinAssignor:
    """Deals partitions to members one topic at a time; shares a partition by key when members
    outnumber partitions.

    Properties, in priority order: coverage (every partition of every subscribed topic is
    assigned whole, exactly once, to its subscribers) > balance (members with the same
    subscription and the same ``allow_individual_commit`` differ in load by at most the largest
    single slice they hold, across all topics) > stickiness (none: the result depends only on
    the members and topics, as with Kafka's RoundRobinAssignor; use ``sticky-join`` to keep
    slices in place).

    Per topic, in name order:
    - *Split*, when the coordinator accepts individual commits, the topic accepts range fetch,
      and the members that allow individual commit ("sharers") outnumber the partitions:
      sharers are reverse-assigned round robin to partitions (the k-th sharer goes to
      partition ``k mod n``) and each partition's hash space is split evenly among the sharers
      on it, in dealing order. Members that do not allow individual commit get nothing from
      this topic: any whole partition given to one would make it the slowest consumer of the
      group, while every sharer already has at most one partition's worth. They stand by, as
      surplus members do in Kafka, and take whole partitions again once sharers are fewer
      than partitions.
    - *Whole*, otherwise: plain round robin of whole partitions over all subscribers.

    Dealing is load-aware across topics, so the first topic reproduces the proposal exactly
    (5 members, 3 partitions -> tp0: M1,M4 / tp1: M2,M5 / tp2: M3) and later topics even out:
    whole partitions are dealt starting with the least loaded member (what Kafka's cursor
    carrying over topics achieves for identical subscriptions), and in a split the partitions
    with fewer sharers (bigger slices) go to the least loaded sharers, ties keeping the plain
    dealing order. Members are ordered by ``MemberSpec.order_key``.
    """

    name = "round-robin"

    def assign(self, group: GroupSpec) -> GroupAssignment:
        return assign_topic_by_topic(group, split=_deal_split, whole=_deal_whole)


def _deal_whole(builder: AssignmentBuilder, topic: TopicSpec, members: list[MemberSpec]) -> None:
    position = {member.member_id: index for index, member in enumerate(members)}
    dealing = sorted(
        members, key=lambda member: (builder.load(member.member_id), position[member.member_id])
    )
    for partition in range(topic.partition_count):
        builder.add_whole(dealing[partition % len(dealing)].member_id, topic.name, partition)


def _deal_split(builder: AssignmentBuilder, topic: TopicSpec, sharers: list[MemberSpec]) -> None:
    partitions = topic.partition_count
    counts = share_counts(len(sharers), partitions)
    crowded = sum(1 for count in counts if count > counts[-1])
    # Plain dealing puts the k-th sharer on partition k mod n, so the ones with k mod n beyond
    # the crowded partitions get the bigger slices; hand those slots to the least loaded.
    naturally_big = [index % partitions >= crowded for index in range(len(sharers))]
    big_slots = sum(naturally_big)
    ranked = sorted(
        range(len(sharers)),
        key=lambda index: (
            builder.load(sharers[index].member_id),
            not naturally_big[index],
            index,
        ),
    )
    big = set(ranked[:big_slots])
    members_on: list[list[MemberSpec]] = [[] for _ in range(partitions)]
    small_seen = big_seen = 0
    for index, member in enumerate(sharers):
        if index in big:
            members_on[crowded + big_seen % (partitions - crowded)].append(member)
            big_seen += 1
        else:
            members_on[small_seen % crowded].append(member)
            small_seen += 1
    for partition, members in enumerate(members_on):
        for member, keys in zip(members, even_split(len(members)), strict=True):
            builder.add(member.member_id, topic.name, partition, keys)
