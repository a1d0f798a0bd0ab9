"""Member ids in join order: the round-robin assignor deals a newcomer last, so a join moves
the members of one partition, not every member after the newcomer's place in a random order
(docs/membership.md, "Subscriptions")."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from coordinator.groups.heartbeat import new_member_id
from tests.groups.test_heartbeat_api import Member, describe, given_topics, set_range_fetch

PARTITIONS = 4
MEMBERS_PER_PARTITION = 3


def test_member_ids_sort_in_the_order_they_were_issued() -> None:
    issued = [new_member_id() for _ in range(20_000)]
    assert issued == sorted(issued), "ids issued within one clock tick must still sort in order"
    assert len(set(issued)) == len(issued)
    assert all(member_id.startswith("m-") and len(member_id) == 34 for member_id in issued)


async def test_a_join_moves_only_the_members_of_the_partition_it_joins(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await given_topics(coordinator_app, dealt=PARTITIONS)
    await set_range_fetch(api, "dealt", True)
    for _ in range(PARTITIONS * MEMBERS_PER_PARTITION):
        await Member(api, "dealt").join(["dealt"])

    # Three newcomers, one after another: with random ids each would land at a random place
    # in the dealing order and move about half of the group.
    for _ in range(3):
        before = {m["member_id"]: m["target"] for m in (await describe(api, "dealt"))["members"]}
        newcomer = Member(api, "dealt")
        await newcomer.join(["dealt"])
        after = {m["member_id"]: m["target"] for m in (await describe(api, "dealt"))["members"]}
        moved = [member_id for member_id, target in before.items() if after[member_id] != target]
        partitions_moved = {s["partition"] for member_id in moved for s in before[member_id]}
        new_targets = after[newcomer.member_id]
        assert new_targets, "the newcomer is dealt a share"
        assert len(partitions_moved) == 1, (moved, partitions_moved)
        assert partitions_moved == {s["partition"] for s in new_targets}
        assert len(moved) <= len(before) // PARTITIONS + 1, moved
