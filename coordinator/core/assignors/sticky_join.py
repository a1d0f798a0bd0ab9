"""Sticky stream-join assignor (KIP-315, extended to key ranges; docs/design.md §6)."""

from __future__ import annotations

from bisect import bisect_right, insort
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from client.protocol.keyspace import HASH_SPACE, KeyRange, normalize, subtract
from coordinator.core.assignment import GroupAssignment, GroupSpec, MemberSpec
from coordinator.core.assignors.base import AssignmentBuilder
from coordinator.core.assignors.tiles import (
    FreeTiles,
    common_count,
    complement,
    full_tiles,
    majority_runs,
    merge_runs,
    prefix_runs,
    run_count,
)

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
    where it holds most hashes. On each number the hash space is cut into a power-of-two grid
    of about 16 tiles per member (``TILES_PER_MEMBER``) and members get whole tiles, as evenly as
    possible (shares differ by at most one tile); each member keeps the lowest tiles of what it
    held up to its quota, and members short of their quota first grow their own ranges into
    adjacent free tiles, then take the lowest free ones. A joiner thus takes a few tiles from
    several members of its number rather than shifting every boundary, so movement stays
    minimal, and no member ever holds more ranges on a partition than it holds tiles, however
    long the churn (exact equal shares would hand every member a new sliver on every change).
    The ranges of a member are the same on every topic of the set. Members that do not allow
    individual commit stand by while the numbers are split (see ``RoundRobinAssignor``).

    *Warm standbys* (``MemberSpec.standbys``, docs/streams.md "Standby key ranges") decide only
    among choices the rules above leave open, so balance and stickiness are exactly as without
    them, and a group with no standbys gets the same assignment: among members holding as
    much, the extra quota goes to those with standbys of what nobody keeps; a free number goes
    first to a member with room that holds a standby of it (most of its hashes first); a member
    with no seat sits where it holds most standby hashes; a member short of its tiles takes
    free tiles its standbys cover before growing its own ranges.
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
        warm = self._standby_claims()
        topics_of = _TopicsOf(self.topics)
        sharers = [member for member in self.members if member.allow_individual_commit]
        splittable = all(group.can_split(topic) for topic in self.topics)
        if splittable and len(sharers) > self.numbers:
            for member, number, ranges in _split_numbers(sharers, claims, warm, self.numbers):
                for topic in topics_of(member):
                    for keys in ranges:
                        builder.add(member.member_id, topic, number, keys)
            return
        for member, numbers in _whole_numbers(list(self.members), claims, warm, self.numbers):
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

    def _standby_claims(self) -> _Claims:
        """The ranges each member keeps standbys of, by partition number over its topics of
        the set: where it would take over warm. Unlike claims, they may overlap."""
        topics = set(self.topics)
        warm: _Claims = {}
        for member in self.members:
            by_number: dict[int, list[KeyRange]] = defaultdict(list)
            for piece in member.standbys:
                if (
                    piece.topic in topics
                    and piece.topic in member.subscribed_topics
                    and piece.partition < self.numbers
                ):
                    by_number[piece.partition].append(piece.keys)
            warm[member.member_id] = {
                number: normalize(set(ranges)) for number, ranges in by_number.items()
            }
        return warm


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
    members: list[MemberSpec], claims: _Claims, warm: _Claims, numbers: int
) -> list[tuple[MemberSpec, list[int]]]:
    base, extra = divmod(numbers, len(members))
    held = {
        member.member_id: sum(_total(ranges) for ranges in claims[member.member_id].values())
        for member in members
    }
    claimed = {number for by_number in claims.values() for number in by_number}
    orphans_warm = {
        member.member_id: sum(
            _total(ranges)
            for number, ranges in warm[member.member_id].items()
            if number not in claimed
        )
        for member in members
    }
    by_holding = sorted(
        members,
        key=lambda member: (
            -held[member.member_id],
            -orphans_warm[member.member_id],
            member.order_key,
        ),
    )
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
    for number, member_id in _warm_heirs(free, members, warm, kept, quota):
        owner[number] = member_id
        kept[member_id].append(number)
    free = [number for number in free if number not in owner]
    cursor = 0
    for member in sorted(
        members, key=lambda member: (len(kept[member.member_id]), member.order_key)
    ):
        wanted = quota[member.member_id] - len(kept[member.member_id])
        kept[member.member_id].extend(free[cursor : cursor + wanted])
        cursor += wanted
    return [(member, sorted(kept[member.member_id])) for member in members]


def _warm_heirs(
    free: list[int],
    members: list[MemberSpec],
    warm: _Claims,
    kept: dict[str, list[int]],
    quota: dict[str, int],
) -> list[tuple[int, str]]:
    """Free numbers, lowest first, each to the member with room holding most of its hashes
    in standbys (then the one holding fewest numbers); indexed by number, so a group without
    standbys pays nothing and a big one only for what its standbys cover."""
    holders: dict[int, list[tuple[int, tuple[int, str, str], str]]] = defaultdict(list)
    for member in members:
        for number, ranges in warm[member.member_id].items():
            holders[number].append((-_total(ranges), member.order_key, member.member_id))
    heirs = []
    room = {member_id: quota[member_id] - len(numbers) for member_id, numbers in kept.items()}
    for number in free:
        candidates = [
            (hashes, quota[member_id] - room[member_id], order, member_id)
            for hashes, order, member_id in holders.get(number, ())
            if room[member_id] > 0
        ]
        if candidates:
            member_id = min(candidates)[3]
            room[member_id] -= 1
            heirs.append((number, member_id))
    return heirs


def _split_numbers(
    sharers: list[MemberSpec], claims: _Claims, warm: _Claims, numbers: int
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
            seat = _warmest_seat(warm[member.member_id], seated, capacity, number)
            seat_of[member.member_id] = seat
            seated[seat].append(member)
    result: list[tuple[MemberSpec, int, list[KeyRange]]] = []
    for number, members in enumerate(seated):
        members.sort(key=lambda member: member.order_key)
        for member, ranges in _share_number(members, claims, warm, number):
            result.append((member, number, ranges))
    return result


def _warmest_seat(
    warm: dict[int, list[KeyRange]],
    seated: list[list[MemberSpec]],
    capacity: list[int],
    lowest: int,
) -> int:
    """The number with room where the member holds most standby hashes, else ``lowest``."""
    rooms = [
        (-_total(ranges), number)
        for number, ranges in warm.items()
        if len(seated[number]) < capacity[number]
    ]
    return min(rooms)[1] if rooms else lowest


# A number shared by k members is cut into a power-of-two grid of about k * TILES_PER_MEMBER
# equal tiles, and members hold whole tiles. Exact equal shares would make every change hand
# each member a sliver, so a member's ranges would grow without bound under churn; whole tiles
# bound them (a member never holds more ranges than tiles) at the price of shares differing by
# one tile: 16 keeps that within ~6% of a share.
TILES_PER_MEMBER = 16
# The grid a number already uses is kept while it has between 1x and 4x the tiles it needs, so
# a group that shrinks does not re-cut (and move) on every leave; finer grids are free to adopt.
GRID_SLACK = 4


def _share_number(
    members: list[MemberSpec], claims: _Claims, warm: _Claims, number: int
) -> list[tuple[MemberSpec, list[KeyRange]]]:
    """Whole tiles of one number's hash space, balanced within one tile; members keep the
    tiles they held up to their quota, and fill up with free tiles their standbys cover, then
    next to what they keep, where they can."""
    held = [claims[member.member_id].get(number, []) for member in members]
    tiles = _tile_grid(len(members), held)
    tile_size = HASH_SPACE // tiles
    runs = majority_runs(held, tile_size)
    counts = [sum(last - first + 1 for first, last in member_runs) for member_runs in runs]
    covered = [full_tiles(warm[member.member_id].get(number, []), tile_size) for member in members]
    orphans = complement(sorted(run for member_runs in runs for run in member_runs), tiles)
    warmth = [common_count(member_covered, orphans) for member_covered in covered]
    base, extra = divmod(tiles, len(members))
    by_holding = sorted(
        range(len(members)), key=lambda index: (-counts[index], -warmth[index], index)
    )
    quotas = [base] * len(members)
    for index in by_holding[:extra]:
        quotas[index] += 1
    kept = [
        prefix_runs(member_runs, quota) for member_runs, quota in zip(runs, quotas, strict=True)
    ]
    free = FreeTiles(complement(sorted(run for member_runs in kept for run in member_runs), tiles))
    short = [index for index in range(len(members)) if run_count(kept[index]) < quotas[index]]
    for index in sorted(short, key=lambda index: -warmth[index]):
        if covered[index]:
            wanted = quotas[index] - run_count(kept[index])
            kept[index] = merge_runs([*kept[index], *free.take_within(covered[index], wanted)])
    for index in short:
        kept[index] = free.extend_adjacent(kept[index], quotas[index] - run_count(kept[index]))
    for index in short:
        kept[index] = merge_runs(
            [*kept[index], *free.take_lowest(quotas[index] - run_count(kept[index]))]
        )
    return [
        (
            member,
            [
                KeyRange(first * tile_size, (last + 1) * tile_size - 1)
                for first, last in member_runs
            ],
        )
        for member, member_runs in zip(members, kept, strict=True)
    ]


def _tile_grid(members: int, held: list[list[KeyRange]]) -> int:
    needed = min(1 << (members * TILES_PER_MEMBER - 1).bit_length(), HASH_SPACE)
    alignment = HASH_SPACE
    seen = False
    for ranges in held:
        for keys in ranges:
            seen = True
            for boundary in (keys.start, keys.end + 1):
                if 0 < boundary < HASH_SPACE:
                    alignment = min(alignment, boundary & -boundary)
    previous = HASH_SPACE // alignment
    if seen and needed <= previous <= GRID_SLACK * needed:
        return previous
    return needed
