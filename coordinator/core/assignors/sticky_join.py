"""Sticky stream-join assignor (KIP-315, extended to key ranges; DESIGN §6)."""

from __future__ import annotations

from bisect import bisect_right, insort
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from client.keyspace import KeyRange, normalize, subtract
from coordinator.core.assignment import GroupAssignment, GroupSpec, MemberSpec
from coordinator.core.assignors.base import AssignmentBuilder, even_split

# member id -> partition number -> key ranges it may keep claiming (disjoint across members)
_Claims = dict[str, dict[int, list[KeyRange]]]


class StickyJoinAssignor:
    """Assigns partition *numbers*, so a member owns the same partitions (and, when shared, the
    same key ranges) of every topic it joins, and keeps what it had across rebalances.

    Properties, in priority order: co-partitioning (whoever holds hash h of partition p of one
    topic of a co-partitioned set holds it on every topic of the set it subscribes to, so join
    keys meet) > coverage (every hash of partition numbers below the smallest partition count
    of the set is assigned exactly once, when the set's members subscribe alike) > balance
    (members of a set differ by at most one partition number, or in a split by at most one
    slice) > stickiness (claims are kept up to the member's quota: when one member leaves only
    its slices move, unless the balance rule must move one member off a crowded partition
    number; when one joins, only what it receives moves).

    *Co-partitioned sets.* Members whose subscriptions share a topic (transitively) form one
    set; sets with no topic in common are assigned independently. As in KIP-315, a set's
    eligible partition numbers are ``0 .. min(partition count over its topics) - 1``: partitions
    beyond that (a topic that grew first) wait until the counts agree again. Members of one set
    that subscribe differently (a rolling upgrade adding a topic to a join) share the set's
    numbers, and a member receives its numbers on the topics *it* subscribes to only; the same
    numbers of the topics it does not subscribe to stay unassigned rather than go to a member
    that could not join them, and wait, at their committed offsets, until the subscriptions
    agree again. KIP-315 accepts the same gap on purpose, so that one upgraded member is not
    flooded with a whole new topic.

    *Whole numbers* (the KIP-315 algorithm), when the set cannot be split or the members that
    allow individual commit ("sharers") do not outnumber the numbers. Each member's quota is
    ``numbers // members``, one more for the ``numbers % members`` members holding the most;
    previous owners keep their numbers up to their quota (a number claimed by two members
    goes to the higher ``member_epoch``, then ``order_key``); unowned and surplus numbers
    are then handed out lowest first, the member holding fewest filling its quota first. From
    scratch this is the range assignment (A: 0,1,2 / B: 3,4,5 / C: 6,7 / D: 8,9); when D
    leaves, C takes 8 and A takes 9, and nothing else moves, as in the KIP's table.

    *Split numbers*, when the coordinator accepts individual commits, every topic of the set
    accepts range fetch and the sharers outnumber the numbers. Every sharer sits on exactly one
    number (so it reads one partition per topic), ``ceil`` or ``floor`` of sharers/numbers to a
    number, the crowded numbers being those most members already claim. A sharer takes the seat
    where it holds most hashes. On each number the hash space is divided into equal quotas;
    each member keeps the lowest hashes of what it held up to its quota, and members short of
    their quota take the freed hashes, lowest first. A joiner thus takes a little from each
    member of its number rather than shifting every boundary, which keeps movement minimal at
    the cost of the joiner's share being several ranges. The ranges of a member are the same on
    every topic of the set. Members that do not allow individual commit stand by while the
    numbers are split (see ``RoundRobinAssignor``).
    """

    name = "sticky-join"

    def assign(self, group: GroupSpec) -> GroupAssignment:
        builder = AssignmentBuilder(group.members)
        for co_partitioned in _co_partitioned_sets(group):
            co_partitioned.assign(group, builder)
        return builder.build()


@dataclass(frozen=True)
class _CoPartitionedSet:
    topics: tuple[str, ...]
    members: tuple[MemberSpec, ...]
    numbers: int

    def assign(self, group: GroupSpec, builder: AssignmentBuilder) -> None:
        claims = self._valid_claims()
        topics_of = _TopicsOf(self.topics)
        sharers = [member for member in self.members if member.allow_individual_commit]
        splittable = all(group.can_split(topic) for topic in self.topics)
        if splittable and len(sharers) > self.numbers:
            for member, number, ranges in _split_numbers(sharers, claims, self.numbers):
                for topic in topics_of(member):
                    for keys in ranges:
                        builder.add(member.member_id, topic, number, keys)
            return
        for member, numbers in _whole_numbers(list(self.members), claims, self.numbers):
            for topic in topics_of(member):
                for number in numbers:
                    builder.add_whole(member.member_id, topic, number)

    def _valid_claims(self) -> _Claims:
        """What each member held, by partition number and over all its topics of the set, with
        a disputed hash going to the higher epoch (KIP-315: the other claim is a zombie's)."""
        topics = set(self.topics)
        wanted: dict[int, dict[str, list[KeyRange]]] = defaultdict(dict)
        for member in self.members:
            for piece in member.owned:
                if (
                    piece.topic in topics
                    and piece.topic in member.subscribed_topics
                    and piece.partition < self.numbers
                ):
                    wanted[piece.partition].setdefault(member.member_id, []).append(piece.keys)
        priority = {
            member.member_id: (-member.member_epoch, member.order_key) for member in self.members
        }
        claims: _Claims = {member.member_id: {} for member in self.members}
        for number, by_member in wanted.items():
            taken: list[KeyRange] = []
            for member_id in sorted(by_member, key=priority.__getitem__):
                # Co-partitioned topics usually carry the same ranges: dedupe before sorting.
                granted = _claim(taken, normalize(set(by_member[member_id])))
                if granted:
                    claims[member_id][number] = granted
        return claims


def _co_partitioned_sets(group: GroupSpec) -> list[_CoPartitionedSet]:
    assignable = {topic.name for topic in group.assignable_topics()}
    parent = {topic: topic for topic in assignable}

    def root(topic: str) -> str:
        while parent[topic] != topic:
            parent[topic] = parent[parent[topic]]
            topic = parent[topic]
        return topic

    subscribed: dict[str, list[str]] = {}
    by_subscription: dict[frozenset[str], list[str]] = {}
    for member in group.ordered_members:
        topics = by_subscription.get(member.subscribed_topics)
        if topics is None:
            topics = sorted(member.subscribed_topics & assignable)
            by_subscription[member.subscribed_topics] = topics
            for topic in topics[1:]:
                parent[root(topic)] = root(topics[0])
        if topics:
            subscribed[member.member_id] = topics
    members_by_root: dict[str, list[MemberSpec]] = defaultdict(list)
    for member in group.ordered_members:
        if member.member_id in subscribed:
            members_by_root[root(subscribed[member.member_id][0])].append(member)
    sets = []
    for members in members_by_root.values():
        topics = sorted({topic for member in members for topic in subscribed[member.member_id]})
        numbers = min(group.topics[topic].partition_count for topic in topics)
        sets.append(_CoPartitionedSet(tuple(topics), tuple(members), numbers))
    return sorted(sets, key=lambda co_partitioned: co_partitioned.topics)


class _TopicsOf:
    """A member's topics within its co-partitioned set, computed once per subscription."""

    def __init__(self, topics: tuple[str, ...]) -> None:
        self._topics = topics
        self._by_subscription: dict[frozenset[str], list[str]] = {}

    def __call__(self, member: MemberSpec) -> list[str]:
        topics = self._by_subscription.get(member.subscribed_topics)
        if topics is None:
            topics = [topic for topic in self._topics if topic in member.subscribed_topics]
            self._by_subscription[member.subscribed_topics] = topics
        return topics


def _claim(taken: list[KeyRange], wanted: list[KeyRange]) -> list[KeyRange]:
    """The part of ``wanted`` not yet in ``taken`` (sorted, disjoint), added to ``taken``."""
    granted = subtract(wanted, taken) if any(_overlaps(taken, keys) for keys in wanted) else wanted
    for keys in granted:
        insort(taken, keys)
    return granted


def _overlaps(sorted_disjoint: list[KeyRange], keys: KeyRange) -> bool:
    index = bisect_right(sorted_disjoint, keys.end, key=lambda existing: existing.start)
    return index > 0 and sorted_disjoint[index - 1].end >= keys.start


def _total(ranges: Iterable[KeyRange]) -> int:
    return sum(keys.size for keys in ranges)


def _whole_numbers(
    members: list[MemberSpec], claims: _Claims, numbers: int
) -> list[tuple[MemberSpec, list[int]]]:
    base, extra = divmod(numbers, len(members))
    held = {
        member.member_id: sum(_total(ranges) for ranges in claims[member.member_id].values())
        for member in members
    }
    by_holding = sorted(members, key=lambda member: (-held[member.member_id], member.order_key))
    quota = {
        member.member_id: base + (1 if rank < extra else 0)
        for rank, member in enumerate(by_holding)
    }
    order = {member.member_id: member.order_key for member in members}
    kept: dict[str, list[int]] = {member.member_id: [] for member in members}
    owner: dict[int, str] = {}
    candidates = sorted(
        (-_total(ranges), order[member_id], number, member_id)
        for member_id, by_number in claims.items()
        if member_id in kept
        for number, ranges in by_number.items()
    )
    for _, _, number, member_id in candidates:
        if number not in owner and len(kept[member_id]) < quota[member_id]:
            owner[number] = member_id
            kept[member_id].append(number)
    free = [number for number in range(numbers) if number not in owner]
    cursor = 0
    for member in sorted(
        members, key=lambda member: (len(kept[member.member_id]), member.order_key)
    ):
        wanted = quota[member.member_id] - len(kept[member.member_id])
        kept[member.member_id].extend(free[cursor : cursor + wanted])
        cursor += wanted
    return [(member, sorted(kept[member.member_id])) for member in members]


def _split_numbers(
    sharers: list[MemberSpec], claims: _Claims, numbers: int
) -> list[tuple[MemberSpec, int, list[KeyRange]]]:
    base, extra = divmod(len(sharers), numbers)
    claimants = [0] * numbers
    for member in sharers:
        for number in claims[member.member_id]:
            claimants[number] += 1
    crowded = set(sorted(range(numbers), key=lambda number: (-claimants[number], number))[:extra])
    capacity = [base + (1 if number in crowded else 0) for number in range(numbers)]
    seated: list[list[MemberSpec]] = [[] for _ in range(numbers)]
    seat_of: dict[str, int] = {}
    candidates = sorted(
        (-_total(ranges), member.order_key, number, index)
        for index, member in enumerate(sharers)
        for number, ranges in claims[member.member_id].items()
    )
    for _, _, number, index in candidates:
        member = sharers[index]
        if member.member_id not in seat_of and len(seated[number]) < capacity[number]:
            seat_of[member.member_id] = number
            seated[number].append(member)
    number = 0
    for member in sharers:
        if member.member_id not in seat_of:
            while len(seated[number]) >= capacity[number]:
                number += 1
            seat_of[member.member_id] = number
            seated[number].append(member)
    result: list[tuple[MemberSpec, int, list[KeyRange]]] = []
    for number, members in enumerate(seated):
        members.sort(key=lambda member: member.order_key)
        for member, ranges in _share_number(members, claims, number):
            result.append((member, number, ranges))
    return result


def _share_number(
    members: list[MemberSpec], claims: _Claims, number: int
) -> list[tuple[MemberSpec, list[KeyRange]]]:
    """Equal quotas of one number's hash space; members keep what they held up to theirs."""
    quotas = [keys.size for keys in even_split(len(members))]
    kept = [
        _prefix(claims[member.member_id].get(number, []), quota)
        for member, quota in zip(members, quotas, strict=True)
    ]
    free = _FreeSpace(subtract([KeyRange.full()], (keys for ranges in kept for keys in ranges)))
    return [
        (member, normalize([*ranges, *free.take(quota - _total(ranges))]))
        for member, quota, ranges in zip(members, quotas, kept, strict=True)
    ]


def _prefix(ranges: list[KeyRange], amount: int) -> list[KeyRange]:
    taken: list[KeyRange] = []
    for keys in ranges:
        if amount <= 0:
            break
        if keys.size <= amount:
            taken.append(keys)
            amount -= keys.size
        else:
            taken.append(KeyRange(keys.start, keys.start + amount - 1))
            amount = 0
    return taken


class _FreeSpace:
    """Hands out freed hashes lowest first, in amounts, without re-scanning what is gone."""

    def __init__(self, ranges: list[KeyRange]) -> None:
        self._ranges = ranges
        self._index = 0

    def take(self, amount: int) -> list[KeyRange]:
        taken: list[KeyRange] = []
        while amount > 0:
            head = self._ranges[self._index]
            if head.size <= amount:
                taken.append(head)
                amount -= head.size
                self._index += 1
            else:
                taken.append(KeyRange(head.start, head.start + amount - 1))
                self._ranges[self._index] = KeyRange(head.start + amount, head.end)
                amount = 0
        return taken
