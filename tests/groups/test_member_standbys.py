"""Member standbys over a real migrated Postgres: a member reports the key ranges it keeps
warm copies of in its heartbeat, the admin description shows them, reporting them moves
nothing, and when a range's owner leaves the sticky stream-join assignor hands it to the
member holding its standby rather than to the one it would pick otherwise (docs/api.md,
"Standby key ranges")."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.groups.test_heartbeat_api import FULL, Member, describe, given_topics

GROUP = "standbys"


def numbers(slices: list[dict[str, Any]]) -> list[int]:
    return sorted(piece["partition"] for piece in slices)


async def settle(members: list[Member]) -> None:
    """Heartbeats until every member owns its target (a few rounds of release and grant)."""
    for _ in range(4):
        for member in members:
            await member.heartbeat()


async def described(api: httpx.AsyncClient, group: str) -> dict[str, dict[str, Any]]:
    return {member["member_id"]: member for member in (await describe(api, group))["members"]}


@pytest.mark.parametrize("warm", [True, False], ids=["standby-held", "no-standby"])
async def test_a_leavers_number_goes_to_the_member_holding_its_standby(
    api: httpx.AsyncClient, coordinator_app: FastAPI, warm: bool
) -> None:
    group = f"{GROUP}-{'warm' if warm else 'cold'}"
    await given_topics(coordinator_app, warm=3)
    members = [Member(api, group) for _ in range(3)]
    for member in members:
        await member.join(["warm"], assignor="sticky-join")
    await settle(members)
    leaver = members[0]
    first, second = sorted(members[1:], key=lambda member: str(member.member_id))
    orphan = numbers(leaver.owned)
    assert len(orphan) == 1
    epoch = (await describe(api, group))["group_epoch"]

    standby = [{"topic": "warm", "partition": orphan[0], "ranges": [FULL]}]
    if warm:
        await second.heartbeat(standbys=standby)
    await first.heartbeat()  # an older member, which never sends the field
    view = await described(api, group)
    assert (await describe(api, group))["group_epoch"] == epoch, "a report moves nothing"
    assert view[str(second.member_id)]["standbys"] == (standby if warm else [])
    assert view[str(first.member_id)]["standbys"] == []

    kept = {str(m.member_id): numbers(m.owned) for m in (first, second)}
    await leaver.leave()
    await settle([first, second])

    heir, other = (second, first) if warm else (first, second)
    assert numbers(heir.owned) == sorted(kept[str(heir.member_id)] + orphan)
    assert numbers(other.owned) == kept[str(other.member_id)]


async def test_standbys_are_kept_until_reported_again_and_an_empty_list_clears_them(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await given_topics(coordinator_app, kept=2)
    member = Member(api, GROUP + "-kept")
    standby = [{"topic": "kept", "partition": 1, "ranges": [[0, 2**62 - 1]]}]
    await member.join(["kept"], standbys=standby)

    async def reported() -> list[dict[str, Any]]:
        body = await describe(api, GROUP + "-kept")
        return list(body["members"][0]["standbys"])

    assert await reported() == standby
    await member.heartbeat()
    assert await reported() == standby
    await member.heartbeat(standbys=[])
    assert await reported() == []


@pytest.mark.parametrize(
    "standbys",
    [
        [{"topic": "t", "partition": 0, "ranges": [[5, 1]]}],
        [{"topic": "t", "partition": 0, "ranges": [FULL]}] * 2,
        [{"topic": "t", "partition": -1, "ranges": [FULL]}],
    ],
    ids=["reversed-range", "partition-twice", "negative-partition"],
)
async def test_malformed_standbys_are_refused(
    api: httpx.AsyncClient, standbys: list[dict[str, Any]]
) -> None:
    reply = await api.post(
        "/v1/groups/standbys-malformed/heartbeat",
        json={"member_epoch": 0, "subscribed_topics": ["t"], "standbys": standbys},
    )
    assert (reply.status_code, reply.json()["error"]) == (400, "INVALID_REQUEST"), reply.text
