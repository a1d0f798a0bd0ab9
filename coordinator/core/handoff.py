"""Prompt hand-offs (docs/membership.md, "Prompt hand-offs"): which heartbeats may wait for a
change, and whom a change concerns. Decided without I/O; the shell holds the replies and
carries the changes between replicas.

A member learns of a new assignment only from a heartbeat reply, so with a fixed interval a
hand-off costs up to two intervals: one for the holder to hear it must give a slice up, one for
the heir to hear it may take it. Shortening every member's interval would multiply the load
of every stable group. Instead a member with nothing to do offers to wait (``wait_ms``), and
the coordinator answers when something changes *for that member* or when the wait runs out,
whichever comes first. The wait replaces the member's sleep between heartbeats, so a held
heartbeat costs what a plain one does.

Only a reply that tells the member nothing new may be held: a held reply the member stops
waiting for (it has something to report) is simply dropped, and the member must lose nothing
by dropping it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from coordinator.core.assignment import Slice, normalize_slices, subtract_slices


@dataclass(frozen=True, slots=True)
class Hold:
    """A reply that may wait. ``short_of_target``: part of the member's target is still held
    by others, so any release in its group may be its grant."""

    short_of_target: bool


@dataclass(frozen=True, slots=True)
class GroupChange:
    """A committed change of a group that other members' held heartbeats may be waiting for.

    ``retargeted``: members whose target moved (each may have to give something up, or may
    now take something); None stands for every member. ``released``: some hash space was let
    go (a member reported a release, left, expired or was removed), which can complete the
    grant of any member short of its target. ``by``: the member whose own heartbeat made the
    change; it has its reply already.
    """

    group_id: str
    retargeted: frozenset[str] | None
    released: bool
    by: str | None = None

    def concerns(self, member_id: str, hold: Hold) -> bool:
        if member_id == self.by:
            return False
        if self.retargeted is None or member_id in self.retargeted:
            return True
        return self.released and hold.short_of_target


def hold_for(
    request_epoch: int,
    reported_owned: Iterable[Slice] | None,
    reply_epoch: int,
    assigned: tuple[Slice, ...],
    target: tuple[Slice, ...],
) -> Hold | None:
    """The hold a heartbeat's reply may take, or None when the reply must go out at once: the
    epoch moved (a new assignment to act on), or what the member reports owning differs from
    what it may own now (it has a release to finish or a grant to take up)."""
    if reported_owned is None or reply_epoch != request_epoch:
        return None
    if normalize_slices(reported_owned) != assigned:
        return None
    return Hold(short_of_target=assigned != target)


def heartbeat_change(
    group_id: str,
    member_id: str | None,
    held_before: tuple[Slice, ...],
    held_after: tuple[Slice, ...],
    retargeted: Collection[str],
    removed: Collection[str],
) -> GroupChange | None:
    """What one heartbeat (or join, or leave) changed for the others: ``removed`` counts the
    members it reaped or that left, whose holdings are free now."""
    released = bool(removed) or bool(subtract_slices(held_before, held_after))
    if not retargeted and not released:
        return None
    return GroupChange(group_id, frozenset(retargeted), released, by=member_id)


def settle_change(
    group_id: str, retargeted: Mapping[str, tuple[Slice, ...]], removed: bool
) -> GroupChange | None:
    """What an admin operation or the reaper changed: new targets, and members removed."""
    if not retargeted and not removed:
        return None
    return GroupChange(group_id, frozenset(retargeted), removed)
