"""The per-tenant caps (docs/quotas.md), decided without I/O.

A coordinator serves many teams, and each cap bounds what one team's clients can make it
store: members per group (each costs heartbeats and assignment work), partitions with stored
offsets per group (rows, IC ranges and watermarks), and groups per tenant. A tenant is the
group prefix of a client token; a token without prefixes, an admin token, or a coordinator
without tokens counts against the whole coordinator.

The shells read the counts under the locks that keep them true (the group's row lock for
members, an advisory lock per tenant or per group for what is created) and ask these
functions; a request refused here has created nothing.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from coordinator.errors import GroupMaxPartitionsReached, GroupMaxSizeReached, MaxGroupsReached

# The tenant of a token without group prefixes: the whole coordinator.
WHOLE_COORDINATOR = ""


def group_scope(group_prefixes: Collection[str], group_id: str) -> str:
    """The tenant a new group ``group_id`` counts against: the longest of the token's
    prefixes that the id starts with (the most specific grant), else the whole coordinator."""
    matching = [prefix for prefix in group_prefixes if group_id.startswith(prefix)]
    return max(matching, key=len, default=WHOLE_COORDINATOR)


def member_cap_refusal(group_id: str, live_members: int, cap: int) -> GroupMaxSizeReached | None:
    """Why a new member may not join a group that has ``live_members``; None when it may.
    Members rejoining in place or taking over a static member's place add nobody."""
    if live_members < cap:
        return None
    return GroupMaxSizeReached(
        f"group '{group_id}' has {live_members} live members, the most allowed "
        f"(max_members_per_group = {cap}); a member may join once another leaves",
        max_members_per_group=cap,
    )


def group_refusals(
    new_groups: Sequence[tuple[str, str]], stored_per_scope: Mapping[str, int], cap: int
) -> dict[str, MaxGroupsReached | None]:
    """For each new ``(group_id, scope)`` in order, why it may not be created (None when it
    may), counting those admitted before it; ``stored_per_scope``: the groups each scope
    holds now."""
    held = dict(stored_per_scope)
    decided: dict[str, MaxGroupsReached | None] = {}
    for group_id, scope in new_groups:
        if group_id in decided:
            continue
        stored = held.get(scope, 0)
        if stored >= cap:
            where = f"with prefix '{scope}'" if scope else "on this coordinator"
            decided[group_id] = MaxGroupsReached(
                f"cannot create group '{group_id}': {stored} groups exist {where}, the most "
                f"allowed (max_groups_per_prefix = {cap}); delete unused groups or let them "
                "expire (offsets_retention_minutes)",
                max_groups_per_prefix=cap,
            )
        else:
            held[scope] = stored + 1
            decided[group_id] = None
    return decided


def partition_refusals(
    requests: Sequence[tuple[str, Collection[tuple[str, int]]]],
    stored_per_group: Mapping[str, int],
    cap: int,
) -> list[GroupMaxPartitionsReached | None]:
    """For each request, in order, as ``(group_id, partitions it would add)``: why it may not
    add them (None when it may), counting what the requests admitted before it add. A request
    is refused whole: a commit is all-or-nothing."""
    held = dict(stored_per_group)
    added: dict[str, set[tuple[str, int]]] = {}
    decided: list[GroupMaxPartitionsReached | None] = []
    for group_id, partitions in requests:
        new = set(partitions) - added.get(group_id, set())
        total = held.get(group_id, 0) + len(new)
        if new and total > cap:
            decided.append(
                GroupMaxPartitionsReached(
                    f"group '{group_id}' has offsets for {held.get(group_id, 0)} partitions; "
                    f"this commit adds {len(new)}, beyond the most allowed "
                    f"(max_partitions_per_group = {cap}); delete the offsets of topics no "
                    "longer consumed",
                    max_partitions_per_group=cap,
                )
            )
            continue
        held[group_id] = total
        added.setdefault(group_id, set()).update(new)
        decided.append(None)
    return decided
