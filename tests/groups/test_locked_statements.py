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
    # Lock, reap and read, write: the holder's revoke announces nothing, its release does.
    assert revoking == ["SELECT groups.group_id,", "WITH expired", "UPDATE members"]
    assert releasing == ["SELECT groups.group_id,", "WITH expired", "UPDATE members + notice"]
