"""Regex subscriptions from any client run in linear time: patterns that make a backtracking
engine take exponential time leave the coordinator answering through the join, the rebalance
and the metadata refresh, and patterns RE2 cannot run are refused with the reason."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from tests.fixtures.coordinator import MakeDatabase, RunningCoordinator
from tests.fixtures.services import MakeTopic
from tests.waiting import until

StartCoordinator = Callable[..., Awaitable[RunningCoordinator]]

# Backtracking engines try every way to split a non-matching name between the alternatives
# (2**n for n characters) or between the groups (n**26): a 25-character topic never finishes.
EVIL_PATTERNS = (r"([\w.-]|[\w.-])*!", "(.*)" * 26 + "!")

# The promise is 50 ms; the suite shares two busy cores, so the assertion allows
# ten times that. A backtracking engine stalls the loop for seconds to forever.
LIVENESS_BOUND_S = 0.5


class LivenessProbe:
    """Asks ``/livez`` over and over on the coordinator's own event loop: the slowest answer
    bounds how long anything on that loop stalled it."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.slowest_s = 0.0
        self.answers = 0

    async def run(self) -> None:
        while True:
            started = time.perf_counter()
            reply = await self.http.get("/livez")
            assert reply.status_code == 200
            self.slowest_s = max(self.slowest_s, time.perf_counter() - started)
            self.answers += 1
            await asyncio.sleep(0.01)


class Member:
    def __init__(self, http: httpx.AsyncClient, group: str) -> None:
        self.http = http
        self.path = f"/v1/groups/{group}/heartbeat"
        self.member_id = ""
        self.epoch = 0
        self.owned: list[dict[str, Any]] = []

    async def join(self, pattern: str) -> None:
        reply = await self.http.post(
            self.path, json={"member_epoch": 0, "subscribed_topic_regex": pattern}
        )
        assert reply.status_code == 200, reply.text
        self._accept(reply.json())

    async def heartbeat(self) -> set[str]:
        body = {"member_id": self.member_id, "member_epoch": self.epoch, "owned": self.owned}
        reply = await self.http.post(self.path, json=body)
        assert reply.status_code == 200, reply.text
        self._accept(reply.json())
        return {entry["topic"] for entry in self.owned}

    def _accept(self, body: dict[str, Any]) -> None:
        self.member_id = body["member_id"]
        self.epoch = body["member_epoch"]
        self.owned = body["assignment"]


async def test_evil_patterns_leave_livez_answering_through_join_rebalance_and_refresh(
    start_coordinator: StartCoordinator,
    make_migrated_database: MakeDatabase,
    kafka_bootstrap: str,
    make_topic: MakeTopic,
) -> None:
    existing = await make_topic(1)
    assert len(existing) >= 25
    coordinator = await start_coordinator(
        await make_migrated_database(), kafka_bootstrap=kafka_bootstrap, metadata_refresh_ms=300
    )
    async with httpx.AsyncClient(base_url=coordinator.url, timeout=60) as http:
        probe = LivenessProbe(http)
        probing = asyncio.create_task(probe.run())
        try:
            for pattern in EVIL_PATTERNS:
                await Member(http, "evil-regex").join(pattern)
            # A topic created after the joins reaches the group only through the metadata
            # refresh, which runs every pattern of the group over every topic of the cluster,
            # and then through a rebalance, which resolves every member's pattern again.
            late = f"{existing}-late"
            watcher = Member(http, "evil-regex")
            await watcher.join(late.replace(".", r"\."))
            await coordinator.app.state.cluster.create_topic(late, 1)
            await until(lambda: _holds(watcher, late), 30, "the refresh to assign the late topic")
        finally:
            probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probing
    assert probe.answers > 0
    assert probe.slowest_s < LIVENESS_BOUND_S, f"/livez took {probe.slowest_s:.3f} s"


async def _holds(member: Member, topic: str) -> bool:
    return topic in await member.heartbeat()


async def test_a_pattern_re2_cannot_run_is_refused_with_the_reason(
    api: httpx.AsyncClient,
) -> None:
    for pattern, reason in ((r"(orders)\1", "invalid escape"), (r"(?=orders).*", "(?=")):
        reply = await api.post(
            "/v1/groups/re2-refused/heartbeat",
            json={"member_epoch": 0, "subscribed_topic_regex": pattern},
        )
        assert reply.status_code == 400, reply.text
        problem = reply.json()
        assert problem["error"] == "INVALID_REQUEST"
        assert "RE2" in problem["detail"] and reason in problem["detail"]
