"""A group's changing heartbeats take turns in the process (``coordinator/groups/turns.py``),
and a group's lock lives only while requests use it."""

from __future__ import annotations

import asyncio

from coordinator.groups.turns import GroupTurns


async def test_one_group_takes_turns_other_groups_do_not_wait_and_locks_are_dropped() -> None:
    turns = GroupTurns()
    order: list[str] = []
    release_first = asyncio.Event()

    async def holder(group_id: str, name: str, release: asyncio.Event | None) -> None:
        async with turns.turn(group_id):
            order.append(f"{name} in")
            if release is not None:
                await release.wait()
            order.append(f"{name} out")

    first = asyncio.create_task(holder("a", "a1", release_first))
    second = asyncio.create_task(holder("a", "a2", None))
    other = asyncio.create_task(holder("b", "b1", None))
    await other
    assert order == ["a1 in", "b1 in", "b1 out"]
    assert len(turns) == 1
    release_first.set()
    await asyncio.gather(first, second)
    assert order[3:] == ["a1 out", "a2 in", "a2 out"]
    assert len(turns) == 0
