"""Heartbeats served without the group's turn or lock (docs/membership.md, "Heartbeats
without the group's turn"), over the real route and Postgres: a hand-off's revoke, release
and grant complete while another request holds the group's turn, and the guarded write lands
only on the rows the step decided from, between two locked transactions of the group, never
inside one."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import httpx
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from coordinator.groups import repository, unlocked_repository
from coordinator.groups.turns import GroupTurns
from tests.groups.test_heartbeat_api import FULL, Member, given_topics, set_range_fetch
from tests.groups.test_prompt_handoff import stable_member
from tests.waiting import until

# Far above what a heartbeat takes on a busy machine; a request that needs the held turn
# would never finish.
ANSWERED_S = 30.0


async def split_partition(app: FastAPI, api: httpx.AsyncClient) -> tuple[str, Member, Member]:
    """A group whose one partition's holder has just been told a newcomer takes half."""
    await given_topics(app, unlocked_flow=1)
    await set_range_fetch(api, "unlocked_flow", True)
    group_id = f"unlocked-{uuid.uuid4().hex[:8]}"
    holder = await stable_member(api, group_id, "unlocked_flow")
    newcomer = Member(api, group_id)
    await newcomer.join(["unlocked_flow"])
    return group_id, holder, newcomer


def ranges(member: Member) -> list[list[int]]:
    return [r for piece in member.owned for r in piece["ranges"]]


async def test_a_hand_off_completes_while_another_request_holds_the_group_s_turn(
    coordinator_app: FastAPI, api: httpx.AsyncClient
) -> None:
    group_id, holder, newcomer = await split_partition(coordinator_app, api)
    turns: GroupTurns = coordinator_app.state.group_turns

    async with turns.turn(group_id):
        revoked = await asyncio.wait_for(holder.heartbeat(), ANSWERED_S)
        await asyncio.wait_for(holder.heartbeat(), ANSWERED_S)  # releases the other half
        granted = await asyncio.wait_for(newcomer.heartbeat(), ANSWERED_S)

    assert revoked["member_epoch"] > 1
    kept, taken = ranges(holder), ranges(newcomer)
    assert granted["assignment"] and len(kept) == len(taken) == 1
    # Each key once, in one member or the other.
    assert kept[0][0] == FULL[0] and taken[0] == [kept[0][1] + 1, FULL[1]]


async def read_holder(
    engine: AsyncEngine, group_id: str, holder: Member
) -> unlocked_repository.UnlockedView:
    """The holder as a snapshot sees it."""
    assert holder.member_id is not None
    async with engine.connect() as connection:
        view = await unlocked_repository.read_view(connection, group_id, holder.member_id)
    assert view is not None
    return view


async def save(engine: AsyncEngine, view: unlocked_repository.UnlockedView) -> bool:
    """The holder's row written back with its assignment revoked, as the unlocked path
    writes it."""
    revoked = replace(view.member, assigned=(), member_epoch=view.member.member_epoch + 1)
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    async with autocommit.connect() as connection:
        return await unlocked_repository.save_if_unchanged(connection, view, revoked, None)


async def stored_epoch(engine: AsyncEngine, group_id: str, member_id: str | None) -> int:
    async with engine.connect() as connection:
        member = await repository.read_member(connection, group_id, str(member_id))
    assert member is not None
    return member.member_epoch


async def revoking_holder(
    app: FastAPI, api: httpx.AsyncClient
) -> tuple[AsyncEngine, str, Member, int]:
    """The app's engine, and a holder told to give half its partition up, with its epoch."""
    engine: AsyncEngine = app.state.engine
    group_id, holder, _ = await split_partition(app, api)
    return engine, group_id, holder, await stored_epoch(engine, group_id, holder.member_id)


async def test_a_write_decided_on_a_stale_read_is_refused(
    coordinator_app: FastAPI, api: httpx.AsyncClient
) -> None:
    engine, group_id, holder, epoch = await revoking_holder(coordinator_app, api)

    member_changed = await read_holder(engine, group_id, holder)
    async with engine.begin() as connection:
        await connection.execute(
            text("UPDATE members SET last_heartbeat = now() WHERE member_id = :m"),
            {"m": holder.member_id},
        )
    group_changed = await read_holder(engine, group_id, holder)
    async with engine.begin() as connection:
        await connection.execute(
            text("UPDATE groups SET group_epoch = group_epoch WHERE group_id = :g"),
            {"g": group_id},
        )

    assert await save(engine, member_changed) is False
    assert await save(engine, group_changed) is False
    assert await stored_epoch(engine, group_id, holder.member_id) == epoch
    fresh = await read_holder(engine, group_id, holder)
    assert await save(engine, fresh) is True
    assert await stored_epoch(engine, group_id, holder.member_id) == epoch + 1


async def waiting_for_a_lock(engine: AsyncEngine) -> bool:
    async with engine.connect() as connection:
        waiting = await connection.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE members%'"
            )
        )
    return bool(waiting)


async def test_the_guarded_write_waits_for_the_group_s_locked_transaction_and_rechecks(
    coordinator_app: FastAPI, api: httpx.AsyncClient
) -> None:
    engine, group_id, holder, epoch = await revoking_holder(coordinator_app, api)

    for locked_transaction_writes_the_member in (False, True):
        view = await read_holder(engine, group_id, holder)
        async with engine.begin() as locked:
            await repository.find_group(locked, group_id, lock=True)
            write = asyncio.create_task(save(engine, view))
            await until(lambda: waiting_for_a_lock(engine), ANSWERED_S, "the write to wait")
            if locked_transaction_writes_the_member:
                await locked.execute(
                    text("UPDATE members SET target = target WHERE member_id = :m"),
                    {"m": holder.member_id},
                )
        written = await asyncio.wait_for(write, ANSWERED_S)
        assert written is not locked_transaction_writes_the_member

    # Written once: after the transaction that changed nothing, not after the one that did.
    assert await stored_epoch(engine, group_id, holder.member_id) == epoch + 1
