"""The statements a locked heartbeat runs, counted at SQLAlchemy's cursor: each is a round trip
inside the group's turn, which a join's hand-off takes heartbeat after heartbeat, so one added
here lengthens every hand-off (docs/membership.md, "Unsettled members" and "Prompt
hand-offs")."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.groups.test_heartbeat_api import Member, given_topics, set_range_fetch
from tests.groups.test_prompt_handoff import stable_member


def statements_where(
    engine: AsyncEngine, keep: Callable[[str, Any], bool]
) -> Callable[[], list[str]]:
    """The statements ``engine`` runs from now on that ``keep`` picks by their text and
    parameters (the app's background loops run statements of their own meanwhile); each
    call returns those recorded since the last."""
    seen: list[str] = []

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def record(_: Any, __: Any, statement: str, parameters: Any, *___: Any) -> None:
        if keep(statement, parameters):
            seen.append(statement)

    def taken() -> list[str]:
        done = list(seen)
        seen.clear()
        return done

    return taken


def group_statements(app: FastAPI, group_id: str) -> Callable[[], list[str]]:
    """The statements run from now on with ``group_id`` among their parameters, each as its
    first two words, and "+ notice" for one that sends a notice."""
    taken = statements_where(app.state.engine, lambda _, parameters: group_id in str(parameters))

    def described() -> list[str]:
        return [
            " ".join(s.split()[:2]) + (" + notice" if "pg_notify" in s else "") for s in taken()
        ]

    return described


async def test_a_heartbeat_s_notice_rides_on_its_member_s_own_statement(
    coordinator_app: FastAPI, api: httpx.AsyncClient
) -> None:
    await given_topics(coordinator_app, counted_flow=1)
    await set_range_fetch(api, "counted_flow", True)
    group_id = f"counted-{uuid.uuid4().hex[:8]}"
    holder = await stable_member(api, group_id, "counted_flow")
    taken = group_statements(coordinator_app, group_id)

    await Member(api, group_id).join(["counted_flow"])
    joined = taken()
    revoked = await holder.heartbeat()
    revoking = taken()
    await holder.heartbeat()
    releasing = taken()

    assert revoked["assignment"] != [] and holder.owned == revoked["assignment"]
    # The join stores the holder's new target and announces it with the newcomer's row.
    assert [s for s in joined if "notice" in s or "pg_notify" in s] == ["INSERT INTO + notice"]
    # Neither the holder's revoke nor its release takes the group's lock or turn: a read,
    # and a write guarded by the versions it read, which carries the release's notice.
    assert revoking == ["SELECT g.xmin::text", "UPDATE members"]
    assert releasing == ["SELECT g.xmin::text", "UPDATE members + notice"]


async def test_a_heartbeat_the_step_cannot_decide_without_the_lock_takes_it(
    coordinator_app: FastAPI, api: httpx.AsyncClient
) -> None:
    await given_topics(coordinator_app, claimed_flow=1)
    group_id = f"claimed-{uuid.uuid4().hex[:8]}"
    holder = await stable_member(api, group_id, "claimed_flow")
    claimed = {"topic": "claimed_flow", "partition": 1, "ranges": [[0, 2**63 - 1]]}
    owned = list(holder.owned)
    taken = group_statements(coordinator_app, group_id)

    # A claim of a slice never assigned is noted in the log, which only the locked path does.
    reply = await holder.heartbeat(owned=[*holder.owned, claimed])

    assert taken() == [
        "SELECT g.xmin::text",
        "SELECT groups.group_id,",
        "WITH expired",
        "UPDATE members",
    ]
    assert reply["assignment"] == owned
