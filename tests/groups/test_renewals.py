"""Stable heartbeats renewed together (``coordinator/groups/renewals.py``): heartbeats that
arrive together share one statement, each is judged by the guard on its own row, and a member
whose row another transaction holds is not waited for but sent down the locked path."""

from __future__ import annotations

import asyncio

import httpx
from fastapi import FastAPI
from sqlalchemy import text

from coordinator.db.engine import make_engine
from coordinator.groups.schemas import HeartbeatRequest
from coordinator.groups.serve import stable_heartbeat
from tests.groups.renewal_statements import count_renewal_statements
from tests.groups.test_heartbeat_api import Member, given_topics
from tests.waiting import until


async def test_heartbeats_arriving_together_share_one_statement_and_skip_a_locked_member(
    coordinator_app: FastAPI, api: httpx.AsyncClient, database_url: str
) -> None:
    await given_topics(coordinator_app, renewed=1)
    members = [Member(api, "renewals") for _ in range(12)]
    for member in members:
        await member.join(["renewed"])

    async def settled() -> bool:
        # Each heartbeat carries what the member's last reply gave it; the group settles
        # once every hand-off between them is done.
        for member in members:
            await member.heartbeat()
        async with coordinator_app.state.engine.connect() as connection:
            return bool(
                await connection.scalar(
                    text(
                        "SELECT bool_and(owned = assigned AND assigned = target) "
                        "FROM members WHERE group_id = 'renewals'"
                    )
                )
            )

    await until(settled, timeout_s=20, what="the group to settle")
    requests = [
        HeartbeatRequest.model_validate(
            {"member_id": m.member_id, "member_epoch": m.epoch, "owned": m.owned}
        )
        for m in members
    ]
    # A fresh engine whose connections report every statement they run: renewals run on
    # the driver connection, below SQLAlchemy's events.
    engine = make_engine(database_url, coordinator_app.state.settings)
    renewal_statements = count_renewal_statements(engine)

    try:
        async with engine.connect() as locker:
            await locker.execute(
                text("SELECT 1 FROM members WHERE member_id = :member_id FOR UPDATE"),
                {"member_id": members[0].member_id},
            )
            renewed = await asyncio.gather(
                *(
                    stable_heartbeat(engine, "renewals", request, coordinator_app.state.settings)
                    for request in requests
                )
            )
            await locker.rollback()
    finally:
        await engine.dispose()

    assert renewal_statements() == 1
    assert renewed[0] is None
    for member, stable in zip(members[1:], renewed[1:], strict=True):
        assert stable is not None
        assert stable.session_timeout_ms == 3_000
        assert member.owned == [] or stable.assigned_json != "[]"
    # The member skipped takes the locked path and is answered as before.
    reply = await members[0].heartbeat()
    assert reply["member_epoch"] == members[0].epoch
