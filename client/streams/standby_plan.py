"""Where standby key ranges go: a pure function of the group's ownership, so every instance
derives the same placement from the same description of the group with no word from the
coordinator (docs/streams.md, "Standby key ranges").

The members that own anything are ordered by member id. A range owned by the member at
position ``i`` has its standbys on the members at ``i + 1, ..., i + replicas`` (wrapping
round, never the owner itself), as Kafka Streams spreads standby tasks over the clients that
do not hold the active one: each member keeps standbys of the few members after it, so the
standbys of one member's ranges are spread over ``replicas`` others, and each member holds
about ``replicas`` times its own share.
"""

from __future__ import annotations

from collections.abc import Iterable

from client.protocol.keyspace import KeyRange

# (topic, partition, first hash, last hash, owner's member id), as the group describes it.
OwnedRange = tuple[str, int, int, int, str]


def standby_ranges(
    owned: Iterable[OwnedRange], member_id: str, replicas: int
) -> list[tuple[str, int, KeyRange]]:
    """The ranges ``member_id`` keeps standbys of, in ``(topic, partition, keys)`` order; none
    when ``replicas`` is 0, when it owns nothing (a member with nothing is in no order yet) or
    when it is alone."""
    entries = list(owned)
    members = sorted({owner for *_, owner in entries})
    if replicas < 1 or member_id not in members or len(members) < 2:
        return []
    position = {owner: index for index, owner in enumerate(members)}
    mine = position[member_id]
    copies = min(replicas, len(members) - 1)
    chosen: set[tuple[str, int, KeyRange]] = set()
    for topic, partition, start, end, owner in entries:
        # How far after the owner this member stands, 1 .. len - 1 (0 is the owner).
        distance = (mine - position[owner]) % len(members)
        if 1 <= distance <= copies:
            chosen.add((topic, partition, KeyRange(start, end)))
    return sorted(chosen, key=lambda entry: (entry[0], entry[1], entry[2].start))
