"""Who may commit and whose heartbeat counts (docs/design.md §3.7), decided in one place.

The shells read the facts under the locks that keep them true (a committing member's row
FOR SHARE, a standalone commit's group row FOR SHARE, a heartbeating member's group row FOR
UPDATE) and ask these functions; nothing else decides. Commit batching and the heartbeat both
call :func:`member_refusal`, so a commit and a heartbeat at the same epoch get the same answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.errors import (
    FencedMemberEpoch,
    IndividualCommitNotAllowed,
    KeyrangeError,
    UnknownMemberId,
)


@dataclass(frozen=True, slots=True)
class MemberStanding:
    """A member row's facts the fence judges: its two accepted epochs and its session."""

    member_epoch: int
    previous_member_epoch: int
    alive: bool


def member_refusal(
    group_id: str, member_id: str, member_epoch: int, standing: MemberStanding | None
) -> UnknownMemberId | FencedMemberEpoch | None:
    """Why a request of ``member_id`` at ``member_epoch`` does not count; None when it does.

    The previous epoch counts too: a member commits what it processed while the revocation
    that bumped its epoch is in flight, and a heartbeat retried after its reply was lost is
    answered (though it releases nothing).
    """
    if standing is None or not standing.alive:
        return UnknownMemberId(
            f"member '{member_id}' is not a live member of '{group_id}'; rejoin with member_epoch 0"
        )
    if member_epoch not in (standing.member_epoch, standing.previous_member_epoch):
        return FencedMemberEpoch(
            f"member epoch {member_epoch} is stale; the member's epoch is "
            f"{standing.member_epoch}: release every slice and rejoin with member_epoch 0",
            member_epoch=standing.member_epoch,
        )
    return None


def switch_refusal(individual: bool, accept_individual_commit: bool) -> KeyrangeError | None:
    """Ranges and watermarks are refused while ``accept.individual.commit`` is off.

    Judged before membership, so a fenced member with an individual commit hears about the
    switch first.
    """
    if individual and not accept_individual_commit:
        return IndividualCommitNotAllowed(
            "the coordinator does not accept individual commits (accept.individual.commit is "
            "off); commit a plain offset"
        )
    return None


def commit_refusal(
    group_id: str,
    member_id: str | None,
    member_epoch: int | None,
    *,
    individual: bool,
    accept_individual_commit: bool,
    live_members: int,
    standing: MemberStanding | None,
) -> KeyrangeError | None:
    """Why a commit may not be applied; None when it may.

    ``individual``: the commit carries ranges or watermarks. A commit without a member id
    (a standalone commit, as by an admin tool or a Spark job) is judged by ``live_members``
    and is only accepted while the group has none; a member's commit by ``standing``.
    """
    refused = switch_refusal(individual, accept_individual_commit)
    if refused is not None:
        return refused
    if member_id is None:
        if live_members == 0:
            return None
        return UnknownMemberId(
            f"group '{group_id}' has {live_members} live member(s); a commit without member "
            "id is only accepted while the group has none"
        )
    assert member_epoch is not None  # the request schema pairs the two
    return member_refusal(group_id, member_id, member_epoch, standing)
