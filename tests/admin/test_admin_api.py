"""Admin routes: groups, offsets, resets refused while members live, switches."""

from __future__ import annotations

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from tests.fixtures.coordinator import insert_live_member


async def _commit(api: httpx.AsyncClient, group: str, *entries: dict[str, object]) -> None:
    reply = await api.post(f"/v1/groups/{group}/offsets/commit", json={"partitions": list(entries)})
    assert reply.status_code == 200, reply.text


async def test_list_groups_and_describe_offsets(api: httpx.AsyncClient) -> None:
    await _commit(api, "adm-list", {"topic": "t", "partition": 0, "ranges": [[5, 9], [12, 12]]})
    groups = (await api.get("/v1/admin/groups")).json()["groups"]
    entry = next(g for g in groups if g["group_id"] == "adm-list")
    assert (entry["members"], entry["partitions"], entry["state"]) == (0, 1, "empty")
    offsets = (await api.get("/v1/admin/groups/adm-list/offsets")).json()["partitions"]
    assert offsets[0]["ic_offsets"] == 6
    missing = await api.get("/v1/admin/groups/no-such-group/offsets")
    assert missing.status_code == 404
    assert missing.json()["error"] == "GROUP_ID_NOT_FOUND"


async def test_reset_to_offset_moves_backwards_and_clears_ranges(api: httpx.AsyncClient) -> None:
    await _commit(
        api,
        "adm-reset",
        {"topic": "t", "partition": 0, "offset": 100},
        {"topic": "t", "partition": 1, "ranges": [[3, 4]]},
    )
    reply = await api.post(
        "/v1/admin/groups/adm-reset/offsets/reset", json={"topic": "t", "to_offset": 10}
    )
    assert reply.status_code == 200, reply.text
    states = {p["partition"]: (p["stable_offset"], p["ranges"]) for p in reply.json()["partitions"]}
    assert states == {0: (10, []), 1: (10, [])}


async def test_reset_without_offset_drops_only_ranges(api: httpx.AsyncClient) -> None:
    await _commit(api, "adm-drop", {"topic": "t", "partition": 0, "offset": 7})
    await _commit(
        api,
        "adm-drop",
        {"topic": "t", "partition": 0, "ranges": [[9, 9]], "watermarks": [[0, 5, 20]]},
    )
    reply = await api.post("/v1/admin/groups/adm-drop/offsets/reset", json={"topic": "t"})
    part = reply.json()["partitions"][0]
    assert (part["stable_offset"], part["ranges"], part["watermarks"]) == (7, [], [])


async def test_reset_and_delete_are_refused_while_members_are_live(
    api: httpx.AsyncClient, database_url: str
) -> None:
    await _commit(api, "adm-live", {"topic": "t", "partition": 0, "offset": 7})
    await insert_live_member(database_url, "adm-live", "m-1")
    for method, path, body in (
        ("POST", "/v1/admin/groups/adm-live/offsets/reset", {"topic": "t", "to_offset": 0}),
        ("DELETE", "/v1/admin/groups/adm-live/offsets", None),
        ("DELETE", "/v1/admin/groups/adm-live", None),
    ):
        reply = await api.request(method, path, json=body)
        assert reply.status_code == 409, reply.text
        assert reply.json()["error"] == "GROUP_NOT_EMPTY"
    engine = create_async_engine(database_url)
    async with engine.begin() as connection:
        await connection.execute(
            text("UPDATE members SET expires_at = now() - interval '1 second'")
        )
    await engine.dispose()
    reply = await api.delete("/v1/admin/groups/adm-live/offsets", params={"topic": "t"})
    assert reply.json() == {"deleted": 1}


async def test_topic_config_defaults_and_overrides(api: httpx.AsyncClient) -> None:
    reply = await api.get("/v1/admin/topics/orders/config")
    assert reply.json() == {"topic": "orders", "accept_range_fetch": False, "explicit": False}
    reply = await api.put("/v1/admin/topics/orders/config", json={"accept_range_fetch": True})
    assert reply.json()["accept_range_fetch"] is True
    assert (await api.get("/v1/admin/topics/orders/config")).json()["explicit"] is True
    bad = await api.put("/v1/admin/topics/orders/config", json={"accept_range_fetch": "maybe"})
    assert bad.status_code == 400


async def test_coordinator_switches_round_trip(api: httpx.AsyncClient) -> None:
    reply = await api.put("/v1/admin/config", json={"default_accept_range_fetch": True})
    assert reply.json() == {"accept_individual_commit": True, "default_accept_range_fetch": True}
    assert (await api.get("/v1/admin/topics/fresh-topic/config")).json()[
        "accept_range_fetch"
    ] is True
    await api.put("/v1/admin/config", json={"default_accept_range_fetch": False})
    assert (await api.get("/v1/admin/config")).json()["default_accept_range_fetch"] is False


async def test_a_switch_change_flags_the_groups_it_concerns_for_rebalance(
    api: httpx.AsyncClient, database_url: str
) -> None:
    """Members the switch left idle (or whose shared partition it closes) see it on their next
    heartbeat, not at the next join or leave. Unchanged values and other topics flag nothing."""
    await _commit(api, "adm-switch", {"topic": "t", "partition": 0, "ranges": [[0, 0]]})
    await _commit(api, "adm-other", {"topic": "other", "partition": 0, "ranges": [[0, 0]]})
    await insert_live_member(database_url, "adm-switch", "m-1")  # subscribed to "t"

    async def flagged(group: str) -> tuple[bool, str | None]:
        reply = (await api.get(f"/v1/admin/groups/{group}")).json()
        return reply["rebalance_requested"], reply["rebalance_reason"]

    current = (await api.get("/v1/admin/topics/t/config")).json()["accept_range_fetch"]
    await api.put("/v1/admin/topics/t/config", json={"accept_range_fetch": current})
    assert await flagged("adm-switch") == (False, None)
    await api.put("/v1/admin/topics/t/config", json={"accept_range_fetch": not current})
    assert await flagged("adm-switch") == (True, "accept.range.fetch changed")
    assert (await flagged("adm-other"))[0] is False

    engine = create_async_engine(database_url)
    async with engine.begin() as connection:
        await connection.execute(
            text("UPDATE groups SET rebalance_requested = false WHERE group_id = 'adm-switch'")
        )
    await engine.dispose()
    switches = (await api.get("/v1/admin/config")).json()
    flipped = not switches["default_accept_range_fetch"]
    await api.put("/v1/admin/config", json={"default_accept_range_fetch": flipped})
    await api.put("/v1/admin/config", json=switches)
    assert await flagged("adm-switch") == (True, "coordinator switches changed")
    await api.put("/v1/admin/topics/t/config", json={"accept_range_fetch": current})
