"""The heartbeat route over a real migrated Postgres: join, heartbeat, leave, static
membership, epochs and fencing, switches, and the membership admin routes."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from fastapi import FastAPI
from prometheus_client import generate_latest

from coordinator import metrics
from coordinator.groups import metadata_repository

FULL = [0, 2**63 - 1]
HALF_END = 2**62 - 1


async def given_topics(app: FastAPI, **partition_counts: int) -> None:
    """Partition counts as the metadata refresh would store them (these tests run no Kafka)."""
    async with app.state.engine.begin() as connection:
        await metadata_repository.write_partition_counts(connection, partition_counts)


async def set_range_fetch(api: httpx.AsyncClient, topic: str, accept: bool) -> None:
    reply = await api.put(f"/v1/admin/topics/{topic}/config", json={"accept_range_fetch": accept})
    assert reply.status_code == 200, reply.text


class Member:
    """A well-behaved client: it owns what its last reply assigned and says so next time."""

    def __init__(self, api: httpx.AsyncClient, group: str) -> None:
        self.api = api
        self.group = group
        self.member_id: str | None = None
        self.epoch = 0
        self.owned: list[dict[str, Any]] = []

    async def send(self, **body: Any) -> httpx.Response:
        return await self.api.post(f"/v1/groups/{self.group}/heartbeat", json=body)

    async def join(self, topics: list[str], **extra: Any) -> dict[str, Any]:
        reply = await self.send(member_epoch=0, subscribed_topics=topics, **extra)
        assert reply.status_code == 200, reply.text
        return self._accept(reply.json())

    async def heartbeat(self, **extra: Any) -> dict[str, Any]:
        body = {"member_id": self.member_id, "member_epoch": self.epoch, "owned": self.owned}
        body.update(extra)
        reply = await self.send(**body)
        assert reply.status_code == 200, reply.text
        return self._accept(reply.json())

    async def leave(self) -> dict[str, Any]:
        reply = await self.send(member_id=self.member_id, member_epoch=-1)
        assert reply.status_code == 200, reply.text
        self.owned = []
        return dict(reply.json())

    def _accept(self, body: dict[str, Any]) -> dict[str, Any]:
        self.member_id = body["member_id"]
        self.epoch = body["member_epoch"]
        self.owned = body["assignment"]
        return body


def partitions(assignment: list[dict[str, Any]]) -> list[tuple[str, int, list[list[int]]]]:
    return [(s["topic"], s["partition"], s["ranges"]) for s in assignment]


async def describe(api: httpx.AsyncClient, group: str) -> dict[str, Any]:
    reply = await api.get(f"/v1/admin/groups/{group}")
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


async def test_join_heartbeat_and_leave_move_partitions_only_after_release(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await given_topics(coordinator_app, flow=2)
    first, second = Member(api, "flow"), Member(api, "flow")
    joined = await first.join(["flow"])
    assert joined["member_id"].startswith("m-")
    assert joined["member_epoch"] > 0
    assert partitions(joined["assignment"]) == [("flow", 0, [FULL]), ("flow", 1, [FULL])]
    steady = await first.heartbeat()
    assert (steady["member_epoch"], steady["assignment"]) == (first.epoch, first.owned)

    await second.join(["flow"])
    assert second.owned == [], "the first member has not released anything yet"
    revoked = await first.heartbeat()
    assert len(revoked["assignment"]) == 1
    assert revoked["member_epoch"] == joined["member_epoch"] + 1
    assert (await second.heartbeat())["assignment"] == [], "not reported released yet"
    await first.heartbeat()  # reports owning only what it keeps
    gained = await second.heartbeat()
    assert len(gained["assignment"]) == 1
    assert {s["partition"] for s in first.owned + second.owned} == {0, 1}
    assert (await describe(api, "flow"))["state"] == "reconciling", "gain not reported yet"
    await second.heartbeat()
    assert (await describe(api, "flow"))["state"] == "stable"

    left = await first.leave()
    assert (left["member_epoch"], left["assignment"]) == (-1, [])
    assert len((await second.heartbeat())["assignment"]) == 2
    assert (await first.leave())["member_epoch"] == -1, "leaving twice is harmless"


async def test_static_member_rejoin_takes_its_old_place_without_rebalance(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await given_topics(coordinator_app, static=4)
    first, second = Member(api, "static"), Member(api, "static")
    await first.join(["static"], instance_id="worker-1")
    await second.join(["static"], instance_id="worker-2")
    for _ in range(3):
        await first.heartbeat()
        await second.heartbeat()
    before = await describe(api, "static")
    assert before["state"] == "stable"
    kept = second.owned

    restarted = Member(api, "static")
    await restarted.join(["static"], instance_id="worker-1")
    assert restarted.member_id != first.member_id
    assert partitions(restarted.owned) == partitions(first.owned)
    after = await describe(api, "static")
    assert after["group_epoch"] == before["group_epoch"], "no rebalance for a static rejoin"
    assert (await second.heartbeat())["assignment"] == kept
    stale = await first.send(member_id=first.member_id, member_epoch=first.epoch, owned=[])
    assert stale.status_code == 409
    assert stale.json()["error"] == "UNKNOWN_MEMBER_ID"


async def test_stale_epochs_are_fenced_and_the_previous_epoch_is_a_harmless_retry(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await given_topics(coordinator_app, fence=2)
    member, other = Member(api, "fence"), Member(api, "fence")
    await member.join(["fence"])
    await member.heartbeat()
    unknown = await member.send(member_id="m-nobody", member_epoch=1)
    assert (unknown.status_code, unknown.json()["error"]) == (409, "UNKNOWN_MEMBER_ID")
    ahead = await member.send(member_id=member.member_id, member_epoch=member.epoch + 5)
    assert (ahead.status_code, ahead.json()["error"]) == (409, "FENCED_MEMBER_EPOCH")
    assert ahead.json()["member_epoch"] == member.epoch

    await other.join(["fence"])
    seen_epoch, seen_owned = member.epoch, member.owned
    revoking = await member.heartbeat()
    assert revoking["member_epoch"] == seen_epoch + 1
    # The revoking reply was "lost": the retry carries the old epoch and both partitions.
    retry = await member.send(member_id=member.member_id, member_epoch=seen_epoch, owned=seen_owned)
    assert retry.status_code == 200, retry.text
    assert retry.json()["member_epoch"] == revoking["member_epoch"]
    assert (await other.heartbeat())["assignment"] == [], "nothing released by a retry"
    too_old = await member.send(member_id=member.member_id, member_epoch=seen_epoch - 1)
    assert (too_old.status_code, too_old.json()["error"]) == (409, "FENCED_MEMBER_EPOCH")

    commit = await api.post(
        "/v1/groups/fence/offsets/commit",
        json={
            "member_id": member.member_id,
            "member_epoch": seen_epoch - 1,
            "partitions": [{"topic": "fence", "partition": 0, "offset": 5}],
        },
    )
    assert (commit.status_code, commit.json()["error"]) == (409, "FENCED_MEMBER_EPOCH")


async def test_fenced_member_rejoins_in_place_with_epoch_zero(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await given_topics(coordinator_app, rejoin=1)
    member = Member(api, "rejoin")
    await member.join(["rejoin"])
    old_epoch = member.epoch
    reply = await member.send(
        member_id=member.member_id, member_epoch=0, subscribed_topics=["rejoin"], owned=[]
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["member_id"] == member.member_id
    assert reply.json()["member_epoch"] > old_epoch
    member.epoch, member.owned = reply.json()["member_epoch"], reply.json()["assignment"]
    assert partitions((await member.heartbeat())["assignment"]) == [("rejoin", 0, [FULL])]


async def test_session_timeout_is_clamped_to_the_coordinator_bounds(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    settings = coordinator_app.state.settings
    await given_topics(coordinator_app, clamp=1)
    cases = [
        (1, settings.session_timeout_min_ms),
        (10**9, settings.session_timeout_max_ms),
        (None, settings.session_timeout_default_ms),
    ]
    for requested, effective in cases:
        member = Member(api, "clamp")
        body = await member.join(["clamp"], session_timeout_ms=requested)
        assert body["session_timeout_ms"] == effective
        assert 0 < body["heartbeat_interval_ms"] <= effective // 3
        await member.leave()


async def test_malformed_heartbeats_are_refused(api: httpx.AsyncClient) -> None:
    bodies = [
        {"member_epoch": 0},
        {"member_epoch": 3},
        {"member_epoch": 0, "subscribed_topics": ["t"], "assignor": "no-such-assignor"},
        {"member_epoch": 0, "subscribed_topic_regex": "(unclosed"},
        {"member_epoch": 0, "subscribed_topics": ["bad topic"]},
        {"member_epoch": -2, "member_id": "m-x"},
        {
            "member_epoch": 0,
            "subscribed_topics": ["t"],
            "owned": [{"topic": "t", "partition": 0, "ranges": [[5, 1]]}],
        },
    ]
    for body in bodies:
        reply = await api.post("/v1/groups/malformed/heartbeat", json=body)
        assert (reply.status_code, reply.json()["error"]) == (400, "INVALID_REQUEST"), body


async def test_topic_without_range_fetch_is_never_split(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await given_topics(coordinator_app, whole=1, shared=1)
    await set_range_fetch(api, "whole", False)
    await set_range_fetch(api, "shared", True)
    members = [Member(api, "split") for _ in range(3)]
    for member in members:
        await member.join(["whole", "shared"])
    for _ in range(4):
        for member in members:
            await member.heartbeat()
    whole = [s for m in members for s in m.owned if s["topic"] == "whole"]
    shared = [s for m in members for s in m.owned if s["topic"] == "shared"]
    assert [s["ranges"] for s in whole] == [[FULL]]
    assert len(shared) == 3
    assert sorted(r for s in shared for r in s["ranges"])[0][0] == 0
    assert sum(e - s + 1 for x in shared for s, e in x["ranges"]) == 2**63


async def test_a_member_left_idle_by_a_switch_is_told_which_and_how_to_turn_it_on(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await given_topics(coordinator_app, unsplit=1)
    await set_range_fetch(api, "unsplit", False)
    members = [Member(api, "idle"), Member(api, "idle")]
    replies: dict[int, list[dict[str, Any]]] = {}
    for index, member in enumerate(members):
        replies[index] = [await member.join(["unsplit"])]
    for _ in range(3):  # round robin may move the partition: let the holder release it
        for index, member in enumerate(members):
            replies[index].append(await member.heartbeat())

    # The reply that leaves a member with nothing says why; a stable member's later
    # replies (the one-statement path) do not repeat it.
    [idle_index] = [i for i, answers in replies.items() if not answers[-1]["assignment"]]
    [told] = [r["idle"] for r in replies[idle_index] if r.get("idle")][-1:]
    assert not any(r.get("idle") for r in replies[1 - idle_index])
    assert told["switch"] == "accept.range.fetch"
    assert told["topics"] == ["unsplit"]
    assert "keyrange admin topic-config unsplit --accept-range-fetch true" in told["message"]

    await set_range_fetch(api, "unsplit", True)
    reply = await api.post("/v1/admin/groups/idle/rebalance")
    assert reply.status_code == 200, reply.text
    for _ in range(3):
        for member in members:
            last = await member.heartbeat()
            assert not last.get("idle")
    assert all(member.owned for member in members)


async def test_member_that_opts_out_of_individual_commit_gets_whole_partitions(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await given_topics(coordinator_app, optout=1)
    await set_range_fetch(api, "optout", True)
    members = [Member(api, "optout") for _ in range(2)]
    await members[0].join(["optout"], allow_individual_commit=False)
    await members[1].join(["optout"])
    for _ in range(4):
        for member in members:
            await member.heartbeat()
    for member in members:
        for held in member.owned:
            assert held["ranges"] == [FULL] or member is members[1]
    assert all(s["ranges"] == [FULL] for s in members[0].owned)


async def test_owned_slices_never_assigned_are_ignored(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await given_topics(coordinator_app, claims=2)
    honest, greedy = Member(api, "claims"), Member(api, "claims")
    await honest.join(["claims"])
    await honest.heartbeat()
    await greedy.join(["claims"])
    claimed = [{"topic": "claims", "partition": p, "ranges": [FULL]} for p in (0, 1)]
    reply = await greedy.heartbeat(owned=claimed)
    assert reply["assignment"] == []
    member = next(
        m for m in (await describe(api, "claims"))["members"] if m["member_id"] == greedy.member_id
    )
    assert member["owned"] == []


async def test_regex_subscription_matches_known_topics(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await given_topics(coordinator_app, **{"re-orders": 1, "re-payments": 1, "unrelated": 1})
    member = Member(api, "regex")
    reply = await member.send(member_epoch=0, subscribed_topic_regex=r"re-.*")
    assert reply.status_code == 200, reply.text
    assert sorted(s["topic"] for s in reply.json()["assignment"]) == ["re-orders", "re-payments"]


async def test_admin_describe_rebalance_and_remove_member(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await given_topics(coordinator_app, admin=2)
    missing = await api.get("/v1/admin/groups/no-such-membership-group")
    assert (missing.status_code, missing.json()["error"]) == (404, "GROUP_ID_NOT_FOUND")

    first, second = Member(api, "admin-g"), Member(api, "admin-g")
    await first.join(["admin"], client_id="worker-a")
    await second.join(["admin"], client_id="worker-b")
    for _ in range(3):
        await first.heartbeat()
        await second.heartbeat()
    described = await describe(api, "admin-g")
    assert described["state"] == "stable"
    assert described["assignor"] == "round-robin"
    by_id = {m["member_id"]: m for m in described["members"]}
    assert by_id[first.member_id]["client_id"] == "worker-a"
    assert by_id[first.member_id]["owned"] == by_id[first.member_id]["target"] == first.owned
    assert by_id[first.member_id]["member_epoch"] == first.epoch

    rebalanced = await api.post("/v1/admin/groups/admin-g/rebalance")
    assert rebalanced.status_code == 200, rebalanced.text
    assert rebalanced.json()["group_epoch"] == described["group_epoch"] + 1

    removed = await api.delete(f"/v1/admin/groups/admin-g/members/{first.member_id}")
    assert removed.status_code == 200, removed.text
    gone = await first.send(member_id=first.member_id, member_epoch=first.epoch, owned=first.owned)
    assert gone.json()["error"] == "UNKNOWN_MEMBER_ID"
    assert len((await second.heartbeat())["assignment"]) == 2
    again = await api.delete(f"/v1/admin/groups/admin-g/members/{first.member_id}")
    assert (again.status_code, again.json()["error"]) == (409, "UNKNOWN_MEMBER_ID")


def metric_value(exposition: str, name: str, **labels: str) -> float | None:
    for line in exposition.splitlines():
        if not line.startswith(name + "{"):
            continue
        label_text, _, value = line[len(name) + 1 :].rpartition("} ")
        found = dict(part.split("=", 1) for part in label_text.split(","))
        if all(found.get(k) == f'"{v}"' for k, v in labels.items()):
            return float(value)
    return None


async def test_rebalances_export_load_and_member_gauges(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await given_topics(coordinator_app, gauges=3)
    members = [Member(api, "gauges") for _ in range(2)]
    for member in members:
        await member.join(["gauges"])
    # Per-group series are kept apart from /metrics' default answer (tests/test_metrics.py).
    per_group = generate_latest(metrics.TENANT_REGISTRY).decode()
    load = "keyrange_group_member_load"
    assert metric_value(per_group, load, group_id="gauges", bound="max") == 2
    assert metric_value(per_group, load, group_id="gauges", bound="min") == 1
    exposition = (await api.get("/metrics")).text
    joined = metric_value(exposition, "keyrange_rebalances_total", reason="member joined")
    assert joined is not None and joined >= 2
    for _ in range(50):
        per_group = generate_latest(metrics.TENANT_REGISTRY).decode()
        if metric_value(per_group, "keyrange_group_members", group_id="gauges") == 2:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("keyrange_group_members never reported the two members")


async def test_a_refused_heartbeat_changes_nothing(api: httpx.AsyncClient) -> None:
    reply = await api.post(
        "/v1/groups/ghost-group/heartbeat", json={"member_id": "m-ghost", "member_epoch": 3}
    )
    assert (reply.status_code, reply.json()["error"]) == (409, "UNKNOWN_MEMBER_ID")
    # Locking the group created its row inside the request's transaction, rolled back.
    assert (await api.get("/v1/admin/groups/ghost-group")).status_code == 404
