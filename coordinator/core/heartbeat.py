"""What a heartbeat does (docs/design.md §5, in the manner of KIP-848), decided without I/O.

The shell (``coordinator.groups.heartbeat``) reads the facts under the group's row lock,
calls :func:`heartbeat_step` and stores the :class:`HeartbeatOutcome`. Nothing here reads or
writes the database, so the randomized safety simulations (through the route and in memory)
run the very same decisions.

Most heartbeats need only the member and what the others hold on its partitions. When the
step must recompute targets (or serve a join) and was not given the whole group, it asks by
returning :class:`MembersNeeded` or :class:`TopicsNeeded`; the shell reads what is asked and
calls again with the same facts plus the answer. The step has decided nothing when it asks,
so calling again is safe and costs little.

Safety rests on one rule: a member's ``assigned`` changes only on that member's own
heartbeat, when its request epoch proves it saw the previous assignment. Everything the
member might still hold — what it reports owning, plus what it was told it may own and has not
acknowledged losing — stays in its stored ``owned | assigned`` ("held"), and nobody is
assigned a hash that another live member holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from client.protocol.epochs import FIRST_MEMBER_EPOCH, JOIN_EPOCH, LEAVE_EPOCH
from coordinator.core.assignment import Slice, normalize_slices, subtract_slices, union_slices
from coordinator.core.fence import MemberStanding, member_refusal
from coordinator.core.handoff import GroupChange, Hold, heartbeat_change, hold_for
from coordinator.core.membership import (
    NO_SUBSCRIPTION,
    GroupRecord,
    Idle,
    MemberRecord,
    Rebalance,
    SessionLimits,
    TopicFacts,
    TopicsNeeded,
    TopicSubscription,
    expiry_reasons,
    idle_reason,
    settle,
    topics_to_read,
)
from coordinator.core.quotas import member_cap_refusal
from coordinator.core.reconcile import MemberHolding, accept_reported_owned, reconcile_member
from coordinator.errors import KeyrangeError


@dataclass(frozen=True, slots=True)
class MemberRequest:
    """A heartbeat as the step reads it: slices decoded, ``None`` meaning "unchanged"."""

    member_id: str | None
    member_epoch: int
    instance_id: str | None = None
    client_id: str | None = None
    client_host: str | None = None
    subscription: TopicSubscription | None = None
    assignor: str | None = None
    allow_individual_commit: bool | None = None
    session_timeout_ms: int | None = None
    owned: tuple[Slice, ...] | None = None
    standbys: tuple[Slice, ...] | None = None


@dataclass(frozen=True, slots=True)
class MembersNeeded:
    """Call again with every live member of the group (after reaping)."""


@dataclass(frozen=True, slots=True)
class Note:
    """Something the shell logs, with the member it concerns."""

    message: str
    fields: Mapping[str, str | None]
    warning: bool = False


@dataclass(frozen=True, slots=True)
class HeartbeatFacts:
    """What the shell read for one heartbeat, under the group's lock.

    ``member``: the requester as stored and live (for a leave, the leaver), None when unknown.
    ``held_by_others``: what the other live members hold on the partitions of ``member``'s
    current target. ``members`` and ``topics`` only when the step asked for them.
    ``new_member_id``: the id a joining member gets, drawn by the shell.
    ``max_members``: the cap on live members a new member may not pass (None: no cap).
    """

    group: GroupRecord
    request: MemberRequest
    session_limits: SessionLimits
    default_assignor: str
    expired: tuple[str, ...] = ()
    member: MemberRecord | None = None
    held_by_others: tuple[Slice, ...] = ()
    members: Mapping[str, MemberRecord] | None = None
    topics: TopicFacts | None = None
    new_member_id: str = ""
    max_members: int | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatOutcome:
    """What to store and answer. ``member`` is the requester's row to write (inserted when
    ``inserted``; None after a leave); ``removed`` the rows to delete; ``targets`` the other
    members' new targets; ``group`` replaces the stored group row when it differs.
    ``change``: what other members' held heartbeats must hear of; ``hold``: whether this
    reply may wait for a change (``coordinator.core.handoff``)."""

    group: GroupRecord
    member: MemberRecord | None
    inserted: bool
    removed: tuple[str, ...]
    targets: Mapping[str, tuple[Slice, ...]]
    rebalance: Rebalance | None
    notes: tuple[Note, ...]
    reply_member_id: str
    reply_epoch: int
    reply_session_timeout_ms: int
    reply_assignment: tuple[Slice, ...] = field(default=())
    reply_idle: Idle | None = None
    change: GroupChange | None = None
    hold: Hold | None = None

    @property
    def leaves_member_unsettled(self) -> bool:
        """Whether the stored member has a release or a grant still to finish (it is not
        ``is_stable``), which the stable renewal's guard refuses (tests/groups/
        test_stable_guard.py): its next heartbeat needs this step again, unless another change
        settles it first."""
        return self.member is not None and not self.member.is_stable


def _changes_only_own_row(facts: HeartbeatFacts, outcome: HeartbeatOutcome) -> bool:
    """Whether storing ``outcome`` writes the requesting member's row and nothing else: no
    other member's target, no member removed or added, the group row as it was, nothing
    reaped and nothing logged. A revoke, a release and a grant are such outcomes; a join, a
    leave and any rebalance are not.

    Such an outcome, decided on a snapshot read without the group's lock, is still the one
    the lock would give if the member's and the group's rows are unchanged when it is
    stored (``coordinator/groups/unlocked_repository.py``): a revoke or a release only
    shrinks what the member holds; a grant takes only hashes of the member's own target,
    which no other member targets at any moment its row is unchanged (targets are disjoint),
    so none can have been granted them since the snapshot saw them free."""
    return (
        facts.member is not None
        and outcome.member is not None
        and not outcome.inserted
        and not outcome.removed
        and not outcome.targets
        and outcome.rebalance is None
        and not outcome.notes
        and not facts.expired
        and outcome.group == facts.group
    )


StepResult = HeartbeatOutcome | MembersNeeded | TopicsNeeded


def own_row_outcome(facts: HeartbeatFacts) -> HeartbeatOutcome | None:
    """The step's outcome when storing it writes only the member's own row
    (:func:`_changes_only_own_row`); None when the step refuses the request, asks for more
    facts, or would change more, all of which the locked path decides under the lock."""
    try:
        outcome = heartbeat_step(facts)
    except KeyrangeError:
        return None
    if isinstance(outcome, HeartbeatOutcome) and _changes_only_own_row(facts, outcome):
        return outcome
    return None


@dataclass(frozen=True, slots=True)
class SentField:
    """One of a member's own fields that a request may carry: absent means unchanged, a new
    value is stored, and ``reason``, when there is one, is why the group's targets are then
    computed again."""

    name: str
    reason: str | None = None


# The member's own fields a request may change besides its subscription, named alike on
# ``MemberRequest`` and ``MemberRecord``, in the order their reasons are given. The stable
# heartbeat's guard (``coordinator.groups.repository``) is built from this list: a field
# added here is compared there too, so a new value never slips past the step.
SENT_FIELDS = (
    SentField("allow_individual_commit", "member switches changed"),
    SentField("assignor", "assignor changed"),
    SentField("session_timeout_ms"),
    SentField("client_id"),
)


def heartbeat_step(facts: HeartbeatFacts) -> StepResult:
    """Join (epoch 0), leave (epoch -1) or heartbeat of a member; raises the fence's refusal
    (``UnknownMemberId``, ``FencedMemberEpoch``) for a heartbeat that does not count, and
    ``GroupMaxSizeReached`` for a new member of a full group."""
    if facts.request.member_epoch > JOIN_EPOCH:
        result = _heartbeat(facts)
    elif facts.request.member_epoch == LEAVE_EPOCH:
        result = _leave(facts)
    else:
        result = _join(facts)
    if isinstance(result, HeartbeatOutcome):
        return _with_handoff(facts, result)
    return result


def _with_handoff(facts: HeartbeatFacts, outcome: HeartbeatOutcome) -> HeartbeatOutcome:
    """Whom the outcome concerns besides the requester, and whether its reply may wait."""
    request = facts.request
    after = outcome.member
    change = heartbeat_change(
        facts.group.group_id,
        outcome.reply_member_id,
        facts.member.held if facts.member is not None else (),
        after.held if after is not None else (),
        retargeted=outcome.targets.keys(),
        removed=(*facts.expired, *outcome.removed),
    )
    hold = None
    if after is not None and request.member_epoch > JOIN_EPOCH:
        hold = hold_for(
            request.member_epoch, request.owned, outcome.reply_epoch, after.assigned, after.target
        )
    return replace(outcome, change=change, hold=hold)


def _member_fields(
    member: MemberRecord,
    request: MemberRequest,
    subscription: TopicSubscription | None,
    session_timeout_ms: int | None,
) -> tuple[MemberRecord, list[str]]:
    """The request's changes to the member's own fields, and the rebalance reasons they
    give. New standbys give none: they only inform the next rebalance, whatever its cause,
    so reporting them never moves a slice."""
    reasons = []
    changes: dict[str, Any] = {}
    if subscription is not None and subscription != TopicSubscription(
        tuple(sorted(member.subscribed_topics)), member.subscribed_topic_regex
    ):
        changes["subscribed_topics"] = subscription.topics
        changes["subscribed_topic_regex"] = subscription.regex
        reasons.append("subscription changed")
    sent = replace(request, session_timeout_ms=session_timeout_ms)
    for sent_field in SENT_FIELDS:
        value = getattr(sent, sent_field.name)
        if value is not None and value != getattr(member, sent_field.name):
            changes[sent_field.name] = value
            if sent_field.reason is not None:
                reasons.append(sent_field.reason)
    if request.standbys is not None and request.standbys != member.standbys:
        changes["standbys"] = request.standbys
    return replace(member, **changes) if changes else member, reasons


def _checked_member(facts: HeartbeatFacts) -> MemberRecord:
    """The heartbeating member, judged by the same fence as its commits; the shell read it
    live (expired members were reaped first)."""
    request = facts.request
    assert request.member_id is not None  # the schema requires it for epochs other than 0
    member = facts.member
    standing = (
        None
        if member is None
        else MemberStanding(member.member_epoch, member.previous_member_epoch, alive=True)
    )
    refused = member_refusal(
        facts.group.group_id, request.member_id, request.member_epoch, standing
    )
    if refused is not None:
        raise refused
    assert member is not None
    return member


def _heartbeat(facts: HeartbeatFacts) -> StepResult:
    """A heartbeat of an existing member: in the common case no other member is read."""
    request = facts.request
    member = _checked_member(facts)
    acknowledged = request.member_epoch == member.member_epoch
    session_timeout = (
        None
        if request.session_timeout_ms is None
        else facts.session_limits.clamp(request.session_timeout_ms)
    )
    member, changes = _member_fields(member, request, request.subscription, session_timeout)
    reasons = [*expiry_reasons(facts.expired), *changes]
    others_hold = facts.held_by_others
    targets: dict[str, tuple[Slice, ...]] = {}
    rebalance = None
    group = facts.group
    if reasons or group.rebalance_requested:
        if facts.members is None:
            return MembersNeeded()
        members = {**facts.members, member.member_id: member}
        settled = settle(group, members, reasons, facts.topics, facts.default_assignor)
        if isinstance(settled, TopicsNeeded):
            return settled
        group, rebalance = settled.group, settled.rebalance
        targets = settled.changed_targets(members, besides=member.member_id)
        member = settled.members[member.member_id]
        # The target moved: what the others hold on its partitions, from the same read.
        others_hold = held_by_others(settled.members, member)
    elif not member.target and facts.topics is None and _subscribes(member):
        # Idle: say why, if a switch is the cause. Asked only when no settle ran, which
        # needs the facts of every member's topics, not just these.
        return TopicsNeeded(topics_to_read((member,)))
    notes: tuple[Note, ...] = ()
    if acknowledged:
        member, notes = _reconciled(member, request.owned, others_hold)
    return _answering(member, group, targets, rebalance, notes, idle=_idle(member, facts))


def _join(facts: HeartbeatFacts) -> StepResult:
    """A new member, a member rejoining in place after being fenced, or a static member
    taking its old place."""
    if facts.members is None:
        return MembersNeeded()
    request = facts.request
    group_id = facts.group.group_id
    members = dict(facts.members)
    subscription = request.subscription or NO_SUBSCRIPTION
    session_timeout = facts.session_limits.clamp(request.session_timeout_ms)
    reasons = expiry_reasons(facts.expired)
    notes: list[Note] = []
    removed: tuple[str, ...] = ()
    inserted = True
    if request.member_id is not None and request.member_id in members:
        member = replace(_taken_over(members[request.member_id]), client_host=request.client_host)
        member, changes = _member_fields(member, request, subscription, session_timeout)
        reasons += changes
        inserted = False
        notes.append(Note("member rejoined", {"group_id": group_id, "member_id": member.member_id}))
    else:
        predecessor = next(
            (
                m
                for m in members.values()
                if request.instance_id is not None and m.instance_id == request.instance_id
            ),
            None,
        )
        member = MemberRecord(
            group_id=group_id,
            member_id=facts.new_member_id,
            instance_id=request.instance_id,
            client_id=request.client_id,
            client_host=request.client_host,
            member_epoch=FIRST_MEMBER_EPOCH,
            previous_member_epoch=FIRST_MEMBER_EPOCH,
            subscribed_topics=subscription.topics,
            subscribed_topic_regex=subscription.regex,
            assignor=request.assignor,
            allow_individual_commit=(
                True if request.allow_individual_commit is None else request.allow_individual_commit
            ),
            session_timeout_ms=session_timeout,
            standbys=request.standbys or (),
        )
        if predecessor is not None:
            # Static membership: the restarted instance inherits its predecessor's place and
            # target without a rebalance; the predecessor's commits are fenced from now on.
            del members[predecessor.member_id]
            removed = (predecessor.member_id,)
            member = _taken_over(
                replace(
                    member,
                    owned=predecessor.owned,
                    assigned=predecessor.assigned,
                    target=predecessor.target,
                    member_epoch=predecessor.member_epoch,
                )
            )
            if (
                TopicSubscription(predecessor.subscribed_topics, predecessor.subscribed_topic_regex)
                != subscription
                or predecessor.allow_individual_commit != member.allow_individual_commit
            ):
                reasons.append("subscription changed")
            notes.append(
                Note(
                    "static member replaced",
                    {
                        "group_id": group_id,
                        "instance_id": request.instance_id,
                        "member_id": member.member_id,
                        "replaced_member_id": predecessor.member_id,
                    },
                )
            )
        else:
            if facts.max_members is not None:
                refused = member_cap_refusal(group_id, len(members), facts.max_members)
                if refused is not None:
                    raise refused
            reasons.append("member joined")
            notes.append(
                Note("member joined", {"group_id": group_id, "member_id": member.member_id})
            )
    members[member.member_id] = member
    settled = settle(facts.group, members, reasons, facts.topics, facts.default_assignor)
    if isinstance(settled, TopicsNeeded):
        return settled
    targets = settled.changed_targets(members, besides=member.member_id)
    member = settled.members[member.member_id]
    # A join's report of owned slices predates its new epoch: a rejoining member keeps what
    # it held until its first heartbeat at that epoch (``_taken_over``).
    member, reconcile_notes = _reconciled(member, None, held_by_others(settled.members, member))
    return _answering(
        member,
        settled.group,
        targets,
        settled.rebalance,
        (*notes, *reconcile_notes),
        inserted=inserted,
        removed=removed,
        idle=_idle(member, facts),
    )


def _answering(
    member: MemberRecord,
    group: GroupRecord,
    targets: Mapping[str, tuple[Slice, ...]],
    rebalance: Rebalance | None,
    notes: tuple[Note, ...],
    *,
    inserted: bool = False,
    removed: tuple[str, ...] = (),
    idle: Idle | None = None,
) -> HeartbeatOutcome:
    """The outcome of a heartbeat or join: store ``member`` and answer with its epoch,
    session and assignment, and why it has nothing when a switch is the cause."""
    if idle is not None:
        notes = (
            *notes,
            Note(
                "member gets no partition: " + idle.message,
                {
                    "group_id": member.group_id,
                    "member_id": member.member_id,
                    "switch": idle.switch,
                    "topics": ",".join(idle.topics),
                },
                warning=True,
            ),
        )
    return HeartbeatOutcome(
        group=group,
        member=member,
        inserted=inserted,
        removed=removed,
        targets=targets,
        rebalance=rebalance,
        notes=notes,
        reply_member_id=member.member_id,
        reply_epoch=member.member_epoch,
        reply_session_timeout_ms=member.session_timeout_ms,
        reply_assignment=member.assigned,
        reply_idle=idle,
    )


def _subscribes(member: MemberRecord) -> bool:
    return bool(member.subscribed_topics or member.subscribed_topic_regex)


def _idle(member: MemberRecord, facts: HeartbeatFacts) -> Idle | None:
    return None if facts.topics is None else idle_reason(member, facts.topics)


def _leave(facts: HeartbeatFacts) -> StepResult:
    """Leaving is idempotent: a retried leave whose first reply was lost succeeds too."""
    request = facts.request
    assert request.member_id is not None  # the schema requires it for a leave
    leaving = facts.member
    reasons = expiry_reasons(facts.expired)
    notes: tuple[Note, ...] = ()
    removed: tuple[str, ...] = ()
    if leaving is not None:
        removed = (leaving.member_id,)
        reasons.append("member left")
        notes = (
            Note("member left", {"group_id": facts.group.group_id, "member_id": leaving.member_id}),
        )
    group, targets, rebalance = facts.group, {}, None
    if reasons or group.rebalance_requested:
        if facts.members is None:
            return MembersNeeded()
        members = {mid: m for mid, m in facts.members.items() if mid not in removed}
        settled = settle(group, members, reasons, facts.topics, facts.default_assignor)
        if isinstance(settled, TopicsNeeded):
            return settled
        group, rebalance = settled.group, settled.rebalance
        targets = settled.changed_targets(members)
    return HeartbeatOutcome(
        group=group,
        member=None,
        inserted=False,
        removed=removed,
        targets=targets,
        rebalance=rebalance,
        notes=notes,
        reply_member_id=request.member_id,
        reply_epoch=LEAVE_EPOCH,
        reply_session_timeout_ms=(
            leaving.session_timeout_ms if leaving else facts.session_limits.default_ms
        ),
    )


def _taken_over(member: MemberRecord) -> MemberRecord:
    """A (re)joining process may still hold anything its predecessor was given, until its
    first report at the new epoch says otherwise; the epoch bump fences the old one."""
    epoch = member.member_epoch + 1
    return replace(
        member,
        owned=member.held,
        assigned=(),
        member_epoch=epoch,
        previous_member_epoch=epoch,
    )


def held_by_others(members: Mapping[str, MemberRecord], member: MemberRecord) -> tuple[Slice, ...]:
    """What the other members hold on the partitions of ``member``'s target: what a shell
    that has every member in hand passes as ``HeartbeatFacts.held_by_others``."""
    wanted = {piece.topic_partition for piece in member.target}
    return normalize_slices(
        piece
        for other_id, other in members.items()
        if other_id != member.member_id
        for piece in (*other.owned, *other.assigned)
        if piece.topic_partition in wanted
    )


# Stands for "every other member" in the holdings handed to ``reconcile_member``; member ids
# the coordinator issues always start with "m-".
_OTHERS = "*others*"


def _reconciled(
    member: MemberRecord, reported: tuple[Slice, ...] | None, held_by_others: tuple[Slice, ...]
) -> tuple[MemberRecord, tuple[Note, ...]]:
    """Decide what ``member`` may own now; the caller has checked that the member saw its
    current assignment (its request carries its current epoch)."""
    mine = MemberHolding(member.owned, member.assigned, member.member_epoch)
    owned = member.owned
    notes: tuple[Note, ...] = ()
    if reported is not None:
        owned = accept_reported_owned(reported, mine)
        if owned != normalize_slices(reported):
            notes = (
                Note(
                    "member reported slices it was never assigned; ignored",
                    {"group_id": member.group_id, "member_id": member.member_id},
                    warning=True,
                ),
            )
    holdings = {
        _OTHERS: MemberHolding(owned=held_by_others),
        member.member_id: MemberHolding(owned, mine.assigned, mine.member_epoch),
    }
    decision = reconcile_member(member.member_id, holdings, member.target)
    # What was assignable until now and is not any more may have been started after the
    # request was sent: it stays held until a later report leaves it out.
    revoked = subtract_slices(mine.assigned, decision.assigned)
    member = replace(member, owned=union_slices(owned, revoked))
    if decision.member_epoch != member.member_epoch:
        member = replace(
            member,
            previous_member_epoch=member.member_epoch,
            member_epoch=decision.member_epoch,
            assigned=decision.assigned,
        )
    return member, notes
