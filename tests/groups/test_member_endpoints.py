"""Member endpoints over a real migrated Postgres: a member advertises where it serves
queries when it joins, the admin description (the owner look-up's source) returns it, a
later heartbeat may change it, it goes with the member, and what is not an HTTP address is
refused with nothing applied (docs/api.md, "Member endpoints"). The owners route returns it
with what each member owns, to any token that may use the group ("Key owners")."""

from __future__ import annotations

import itertools

import httpx
import pytest
from fastapi import FastAPI

from client.protocol.keyspace import HASH_MAX, HASH_MIN
from coordinator.app import create_app
from tests.fixtures.coordinator import settings_for_tests
from tests.groups.test_heartbeat_api import Member, describe, given_topics, set_range_fetch


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


async def test_owners_name_each_owned_range_and_its_address_to_a_client_token_of_the_group(
    database_url: str,
) -> None:
    """What a streams instance reads to route a query: no admin token needed, nothing of
    the members beyond who owns what and where it serves, and only for the token's groups."""
    settings = settings_for_tests(
        admin_tokens=["admin-owners"],
        client_tokens=[
            {"token": "team-owners", "group_prefixes": ["owners-"]},
            {"token": "elsewhere", "group_prefixes": ["other-"]},
        ],
    )
    app = create_app(settings, database_url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        admin = {"Authorization": "Bearer admin-owners"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://c", headers=admin
        ) as api:
            await given_topics(app, owned_topic=1)
            await set_range_fetch(api, "owned_topic", True)
        headers = {"Authorization": "Bearer team-owners"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://c", headers=headers
        ) as api:
            serving, silent = Member(api, "owners-g"), Member(api, "owners-g")
            await serving.join(["owned_topic"], endpoint="http://10.0.0.7:7070", instance_id="s-0")
            await silent.join(["owned_topic"])
            for _ in range(4):
                await serving.heartbeat()
                await silent.heartbeat()

            reply = await api.get("/v1/groups/owners-g/owners")
            assert reply.status_code == 200, reply.text
            described = reply.json()
            assert set(described) == {"group_id", "group_epoch", "owners"}
            ranges = {
                (o["member_id"], o["instance_id"], o["endpoint"]): o["ranges"]
                for o in described["owners"]
            }
            assert set(ranges) == {
                (serving.member_id, "s-0", "http://10.0.0.7:7070"),
                (silent.member_id, None, None),
            }
            covered = sorted(r for owned in ranges.values() for r in owned)
            assert (covered[0][0], covered[-1][1]) == (HASH_MIN, HASH_MAX)
            assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(covered))

            missing = await api.get("/v1/groups/owners-none/owners")
            assert (missing.status_code, missing.json()["error"]) == (404, "GROUP_ID_NOT_FOUND")
            # The whole description stays an admin's.
            assert (await api.get("/v1/admin/groups/owners-g")).status_code == 403
        other = {"Authorization": "Bearer elsewhere"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://c", headers=other
        ) as api:
            assert (await api.get("/v1/groups/owners-g/owners")).status_code == 403
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as anonymous:
            assert (await anonymous.get("/v1/groups/owners-g/owners")).status_code == 401


async def test_an_endpoint_on_a_host_the_operator_did_not_allow_is_refused_by_name(
    database_url: str,
) -> None:
    """Peers send queries to what members advertise: an operator's allow-list keeps a member
    from pointing them at any address they reach (docs/security.md, "Queries over HTTP")."""
    settings = settings_for_tests(
        allowed_endpoint_hosts=["10.1.0.0/16", "*.streams.svc.cluster.local"]
    )
    app = create_app(settings, database_url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://c") as api:
            await given_topics(app, allowed_topic=1)
            for endpoint in (
                "http://169.254.169.254",
                "http://10.2.0.5:7070",
                "http://attacker.example:80",
                "http://streams.svc.cluster.local.attacker.example:80",
            ):
                reply = await api.post(
                    "/v1/groups/endpoints-allowed/heartbeat",
                    json={
                        "member_epoch": 0,
                        "subscribed_topics": ["allowed_topic"],
                        "endpoint": endpoint,
                    },
                )
                assert reply.status_code == 403, reply.text
                assert reply.json()["error"] == "ENDPOINT_NOT_ALLOWED", reply.text
            assert (await api.get("/v1/admin/groups/endpoints-allowed")).status_code == 404

            first, second = Member(api, "endpoints-allowed"), Member(api, "endpoints-allowed")
            await first.join(["allowed_topic"], endpoint="http://10.1.3.4:7070")
            await second.join(
                ["allowed_topic"], endpoint="https://s-1.Streams.svc.cluster.local:7443/q"
            )
            refused = await api.post(
                "/v1/groups/endpoints-allowed/heartbeat",
                json={
                    "member_id": first.member_id,
                    "member_epoch": first.epoch,
                    "endpoint": "http://127.0.0.1:9999",
                },
            )
            assert (refused.status_code, refused.json()["error"]) == (403, "ENDPOINT_NOT_ALLOWED")
            assert set((await endpoints_of(api, "endpoints-allowed")).values()) == {
                "http://10.1.3.4:7070",
                "https://s-1.Streams.svc.cluster.local:7443/q",
            }


def test_the_allowed_hosts_setting_is_checked() -> None:
    with pytest.raises(ValueError, match="allowed_endpoint_hosts"):
        settings_for_tests(allowed_endpoint_hosts=["10.0.0.0/33"])
    with pytest.raises(ValueError, match="allowed_endpoint_hosts"):
        settings_for_tests(allowed_endpoint_hosts=[" "])
