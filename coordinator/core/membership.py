"""The membership's records and the group-level decision (docs/design.md §5-6), without I/O: which
assignor a group runs, what each member's subscription resolves to, and :func:`settle`, which
recomputes every member's target when something changed. The heartbeat step
(``coordinator.core.heartbeat``), the admin operations and the reaper all settle a group
through it; the shell (``coordinator.groups``) reads the facts it asks for and stores what it
returns.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from coordinator.core.assignment import (
    GroupAssignment,
    GroupSpec,
    MemberSpec,
    Slice,
    TopicSpec,
    normalize_slices,
    union_slices,
)
from coordinator.core.assignors import get_assignor
from coordinator.core.topic_pattern import matching_topics


@dataclass(frozen=True, slots=True)
class GroupRecord:
    group_id: str
    assignor: str | None
    group_epoch: int
    rebalance_requested: bool
    rebalance_reason: str | None


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """A member as the coordinator keeps it; slice collections normalized, topics sorted.
    ``owned`` is what the member last reported (plus what it may still be finishing),
    ``assigned`` what it was last told it may own, ``target`` where the assignor wants it;
    ``standbys`` the key ranges it last reported keeping warm copies of."""

    group_id: str
    member_id: str
    instance_id: str | None
    client_id: str | None
    client_host: str | None
    member_epoch: int
    previous_member_epoch: int
    subscribed_topics: tuple[str, ...]
    subscribed_topic_regex: str | None
    assignor: str | None
    allow_individual_commit: bool
    session_timeout_ms: int
    owned: tuple[Slice, ...] = ()
    assigned: tuple[Slice, ...] = ()
    target: tuple[Slice, ...] = ()
    joined_at: datetime | None = None
    last_heartbeat: datetime | None = None
    expires_at: datetime | None = None
    standbys: tuple[Slice, ...] = ()

    @property
    def held(self) -> tuple[Slice, ...]:
        return union_slices(self.owned, self.assigned)

    @property
    def is_stable(self) -> bool:
        return self.owned == self.assigned == self.target


@dataclass(frozen=True, slots=True)
class TopicSubscription:
    topics: tuple[str, ...]  # sorted, no duplicates
    regex: str | None

    @classmethod
    def of(cls, topics: Iterable[str] | None, regex: str | None) -> TopicSubscription:
        return cls(tuple(sorted(set(topics or ()))), regex)


NO_SUBSCRIPTION = TopicSubscription((), None)


@dataclass(frozen=True, slots=True)
class SessionLimits:
    default_ms: int
    min_ms: int
    max_ms: int

    def clamp(self, requested: int | None) -> int:
        if requested is None:
            requested = self.default_ms
        return max(self.min_ms, min(self.max_ms, requested))


@dataclass(frozen=True, slots=True)
class TopicFacts:
    """What the assignor needs beside the members: known partition counts (every topic the
    members could resolve to), explicit per-topic ``accept.range.fetch``, and the switches."""

    partition_counts: Mapping[str, int]
    accept_range_fetch: Mapping[str, bool]
    default_accept_range_fetch: bool
    accept_individual_commit: bool


@dataclass(frozen=True, slots=True)
class TopicsNeeded:
    """Call again with :class:`TopicFacts` for these topics; ``None``: every known topic (a
    member subscribes by regex)."""

    topics: frozenset[str] | None


@dataclass(frozen=True, slots=True)
class Rebalance:
    """A recomputation of the group's targets, for the shell's log and metrics."""

    reason: str
    assignor: str
    members: int
    before: GroupAssignment
    after: GroupAssignment
    changed_targets: int


@dataclass(frozen=True, slots=True)
class Settled:
    group: GroupRecord
    members: Mapping[str, MemberRecord]
    rebalance: Rebalance | None

    def changed_targets(
        self, before: Mapping[str, MemberRecord], *, besides: str | None = None
    ) -> dict[str, tuple[Slice, ...]]:
        """New targets of the members in ``before``, except ``besides`` (a requester whose
        whole row the caller writes)."""
        return {
            member_id: member.target
            for member_id, member in self.members.items()
            if member_id != besides
            and member_id in before
            and before[member_id].target != member.target
        }


def group_state(group: GroupRecord, live_members: Iterable[MemberRecord]) -> str:
    """``empty``, ``reconciling`` (a rebalance is pending or some member has not reached its
    target) or ``stable``, as the admin API describes a group."""
    members = list(live_members)
    if not members:
        return "empty"
    if group.rebalance_requested or not all(m.is_stable for m in members):
        return "reconciling"
    return "stable"


def expiry_reasons(expired: Collection[str]) -> list[str]:
    return ["member session expired"] if expired else []


def group_assignor(members: Iterable[MemberRecord], default_assignor: str) -> str:
    """The most requested assignor (ties: by name), as KIP-848 picks a group's assignor."""
    votes = Counter(m.assignor or default_assignor for m in members)
    if not votes:
        return default_assignor
    return min(votes, key=lambda name: (-votes[name], name))


def resolved_topics(member: MemberRecord, known_topics: Iterable[str]) -> list[str]:
    topics = set(member.subscribed_topics)
    if member.subscribed_topic_regex is not None:
        topics |= matching_topics(member.subscribed_topic_regex, known_topics)
    return sorted(topics)


@dataclass(frozen=True, slots=True)
class Idle:
    """Why a subscribed member was given nothing, when a switch is the cause: it names the
    switch (docs/design.md §4), the topics concerned and what to do, for the reply and the log."""

    switch: str
    topics: tuple[str, ...]
    message: str


def idle_reason(member: MemberRecord, topics: TopicFacts) -> Idle | None:
    """The switch that keeps ``member`` idle: its topics have partitions, other members own
    all of them, and none may be split by key. None when it has a target, or when its topics
    have no partitions yet (the metadata refresh assigns them once they appear)."""
    if member.target:
        return None
    counts = topics.partition_counts
    subscribed = tuple(t for t in resolved_topics(member, counts) if counts.get(t, 0) > 0)
    if not subscribed:
        return None
    owned_by_others = f"every partition of {', '.join(subscribed)} is owned by another member"
    if not topics.accept_individual_commit:
        return Idle(
            "accept.individual.commit",
            subscribed,
            f"{owned_by_others} and the coordinator's accept.individual.commit is off, so no "
            "partition may be split by key; turn it on with "
            "`keyrange admin config --accept-individual-commit true`",
        )
    if not member.allow_individual_commit:
        return Idle(
            "allow.individual.commit",
            subscribed,
            f"{owned_by_others} and this member set allow_individual_commit=False, so it only "
            "takes whole partitions; start it with allow_individual_commit=True to share one",
        )
    closed = tuple(
        t
        for t in subscribed
        if not topics.accept_range_fetch.get(t, topics.default_accept_range_fetch)
    )
    if not closed:
        return None
    return Idle(
        "accept.range.fetch",
        closed,
        f"{owned_by_others} and accept.range.fetch is off for {', '.join(closed)}, so its "
        "partitions may not be split by key; turn it on with "
        + "; ".join(f"`keyrange admin topic-config {t} --accept-range-fetch true`" for t in closed),
    )


def topics_to_read(members: Iterable[MemberRecord]) -> frozenset[str] | None:
    """The topics whose facts an assignment of ``members`` needs; None: all known ones."""
    wanted: set[str] = set()
    for member in members:
        if member.subscribed_topic_regex:
            return None
        wanted.update(member.subscribed_topics)
    return frozenset(wanted)


def settle(
    group: GroupRecord,
    members: Mapping[str, MemberRecord],
    reasons: list[str],
    topics: TopicFacts | None,
    default_assignor: str,
) -> Settled | TopicsNeeded:
    """Recompute targets when membership, subscriptions or topics changed (``reasons``) or
    a rebalance was requested; otherwise the group stays as it is. The new group row is the
    caller's to store last."""
    if group.rebalance_requested:
        reasons = [*reasons, group.rebalance_reason or "rebalance requested"]
    if not reasons:
        return Settled(group, members, None)
    if topics is None:
        return TopicsNeeded(topics_to_read(members.values()))
    assignor_name = group_assignor(members.values(), default_assignor)
    counts = topics.partition_counts
    subscriptions = {mid: resolved_topics(m, counts) for mid, m in members.items()}
    subscribed = {t for names in subscriptions.values() for t in names if t in counts}
    spec = GroupSpec.of(
        (
            MemberSpec(
                member_id=mid,
                subscribed_topics=frozenset(t for t in subscriptions[mid] if t in counts),
                allow_individual_commit=m.allow_individual_commit,
                # Stickiness keeps the previous target: what members report lags behind it.
                owned=m.target,
                member_epoch=m.member_epoch,
                instance_id=m.instance_id,
                standbys=m.standbys,
            )
            for mid, m in members.items()
        ),
        (
            TopicSpec(
                name=t,
                partition_count=counts[t],
                accept_range_fetch=topics.accept_range_fetch.get(
                    t, topics.default_accept_range_fetch
                ),
            )
            for t in sorted(subscribed)
        ),
        accept_individual_commit=topics.accept_individual_commit,
    )
    assignment = get_assignor(assignor_name).assign(spec)
    settled: dict[str, MemberRecord] = {}
    changed = 0
    for mid, member in members.items():
        target = normalize_slices(assignment.get(mid, ()))
        if target != member.target:
            member = replace(member, target=target)
            changed += 1
        settled[mid] = member
    rebalance = Rebalance(
        reason=reasons[0],
        assignor=assignor_name,
        members=len(members),
        before={mid: m.target for mid, m in members.items()},
        after=assignment,
        changed_targets=changed,
    )
    new_group = GroupRecord(
        group_id=group.group_id,
        assignor=assignor_name,
        group_epoch=group.group_epoch + 1,
        rebalance_requested=False,
        rebalance_reason=None,
    )
    return Settled(new_group, settled, rebalance)
