"""Member endpoints over a real migrated Postgres: a member advertises where it serves
queries when it joins, the admin description (the owner look-up's source) returns it, a
later heartbeat may change it, it goes with the member, and what is not an HTTP address is
refused with nothing applied (docs/api.md, "Member endpoints")."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from tests.groups.test_heartbeat_api import Member, describe, given_topics


async def endpoints_of(api: httpx.AsyncClient, group: str) -> dict[str, str | None]:
    return {m["member_id"]: m["endpoint"] for m in (await describe(api, group))["members"]}


async def test_an_endpoint_advertised_at_the_join_is_described_changed_and_forgotten(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await given_topics(coordinator_app, served=2)
    serving, silent = Member(api, "endpoints"), Member(api, "endpoints")
    await serving.join(["served"], endpoint="http://10.0.0.5:7070")
    await silent.join(["served"])
    await serving.heartbeat()
    await silent.heartbeat()
    assert await endpoints_of(api, "endpoints") == {
        serving.member_id: "http://10.0.0.5:7070",
        silent.member_id: None,
    }

    # A heartbeat without the field keeps it; one with it replaces it, even a stable one.
    await serving.heartbeat()
    await serving.heartbeat(endpoint="https://streams-0.streams.svc:7443/queries")
    described = await endpoints_of(api, "endpoints")
    assert described[serving.member_id] == "https://streams-0.streams.svc:7443/queries"

    await serving.leave()
    assert await endpoints_of(api, "endpoints") == {silent.member_id: None}


@pytest.mark.parametrize(
    "endpoint",
    [
        "10.0.0.5:7070",
        "ftp://host:21",
        "javascript:alert(1)",
        "http://",
        "http://a b:1",
        "http://user@host:1",
        "http://host:1/?q",
        "http://" + "h" * 1_000,
    ],
)
async def test_what_is_not_an_http_address_is_refused_before_anything_is_stored(
    api: httpx.AsyncClient, coordinator_app: FastAPI, endpoint: str
) -> None:
    await given_topics(coordinator_app, refused=1)
    reply = await api.post(
        "/v1/groups/endpoints-refused/heartbeat",
        json={"member_epoch": 0, "subscribed_topics": ["refused"], "endpoint": endpoint},
    )
    assert reply.status_code == 400, reply.text
    assert "endpoint" in reply.text
    missing = await api.get("/v1/admin/groups/endpoints-refused")
    assert missing.status_code == 404
