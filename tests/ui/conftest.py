"""A coordinator with a live group for the console tests: three members sharing one
partition through real heartbeats, committed offsets with an IC range and a watermark piece,
records in the partition so there is lag, and an empty group whose offsets may be reset."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest_asyncio

from coordinator.kafka import ClusterMetadata
from tests.e2e.harness import produce
from tests.fixtures.coordinator import MakeDatabase, RunningCoordinator
from tests.waiting import until

ADMIN_TOKEN = "console-admin-token"
HALF = 2**62
RECORDS = 40
STABLE_OFFSET = 10
IC_RANGE = (15, 17)
# Lag leaves out the offsets committed individually above the stable offset.
LAG = RECORDS - STABLE_OFFSET - (IC_RANGE[1] - IC_RANGE[0] + 1)
WATERMARK = (0, HALF - 1, 20)
IDLE_STABLE_OFFSET = 25
MEMBERS = 3


class HeartbeatingMember:
    """A member that heartbeats through the API until stopped or removed, always reporting
    as owned what its last reply assigned (a well-behaved client with nothing in flight)."""

    def __init__(self, api: httpx.AsyncClient, group: str, topic: str, client_id: str) -> None:
        self.api = api
        self.group = group
        self.topic = topic
        self.client_id = client_id
        self.member_id: str | None = None
        self.epoch = 0
        self.owned: list[dict[str, Any]] = []
        self.removed = False
        self._task: asyncio.Task[None] | None = None
        self._stuck: list[dict[str, Any]] | None = None

    async def start(self) -> None:
        reply = await self.api.post(
            f"/v1/groups/{self.group}/heartbeat",
            json={
                "member_epoch": 0,
                "subscribed_topics": [self.topic],
                "client_id": self.client_id,
                "session_timeout_ms": 30_000,
            },
        )
        assert reply.status_code == 200, reply.text
        self._accept(reply.json())
        self._task = asyncio.create_task(self._beat())

    def report_stuck(self, calls: list[dict[str, Any]]) -> None:
        """Send these stuck calls with the next heartbeat (docs/api.md, "Stuck calls"), as a
        client whose handler will not return would."""
        self._stuck = calls

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            body = {"member_id": self.member_id, "member_epoch": self.epoch, "owned": self.owned}
            if self._stuck is not None:
                body["stuck"], self._stuck = self._stuck, None
            reply = await self.api.post(f"/v1/groups/{self.group}/heartbeat", json=body)
            if reply.status_code == 409:  # removed by an admin: a real client would rejoin
                self.removed = True
                return
            if reply.status_code == 200:
                self._accept(reply.json())

    def _accept(self, body: dict[str, Any]) -> None:
        self.member_id = body["member_id"]
        self.epoch = body["member_epoch"]
        self.owned = body["assignment"]

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if not self.removed:
            await self.api.post(
                f"/v1/groups/{self.group}/heartbeat",
                json={"member_id": self.member_id, "member_epoch": -1},
            )


@dataclass
class LiveConsole:
    url: str
    api: httpx.AsyncClient
    topic: str
    group: str
    idle_group: str
    members: list[HeartbeatingMember]

    async def describe(self, group: str | None = None) -> dict[str, Any]:
        reply = await self.api.get(f"/v1/admin/groups/{group or self.group}")
        assert reply.status_code == 200, reply.text
        return dict(reply.json())


async def commit(api: httpx.AsyncClient, group: str, topic: str, **partition: Any) -> None:
    reply = await api.post(
        f"/v1/groups/{group}/offsets/commit",
        json={"partitions": [{"topic": topic, "partition": 0, **partition}]},
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["partitions"][0]["error"] is None, reply.text


def owners(description: dict[str, Any]) -> dict[str, list[list[int]]]:
    """Each member's owned key ranges of partition 0."""
    return {
        member["member_id"]: [r for piece in member["owned"] for r in piece["ranges"]]
        for member in description["members"]
    }


@pytest_asyncio.fixture(scope="module")
async def live_console(
    make_migrated_database: MakeDatabase,
    start_coordinator: Callable[..., Awaitable[RunningCoordinator]],
    kafka_bootstrap: str,
    cluster_metadata: ClusterMetadata,
) -> AsyncIterator[LiveConsole]:
    suffix = uuid.uuid4().hex[:6]
    topic = f"ui-orders-{suffix}"
    await cluster_metadata.create_topic(topic, 1)
    await produce(kafka_bootstrap, topic, [b"key-%d" % i for i in range(RECORDS)])
    coordinator = await start_coordinator(
        await make_migrated_database(), kafka_bootstrap=kafka_bootstrap, admin_tokens=[ADMIN_TOKEN]
    )
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=coordinator.url, headers=headers, timeout=10) as api:
        reply = await api.put(f"/v1/admin/topics/{topic}/config", json={"accept_range_fetch": True})
        assert reply.status_code == 200, reply.text
        group, idle_group = f"ui-live-{suffix}", f"ui-idle-{suffix}"
        await commit(api, group, topic, offset=STABLE_OFFSET)
        await commit(api, group, topic, ranges=[list(IC_RANGE)], watermarks=[list(WATERMARK)])
        await commit(api, idle_group, topic, offset=IDLE_STABLE_OFFSET)
        members = [
            HeartbeatingMember(api, group, topic, f"worker-{index}") for index in range(MEMBERS)
        ]
        console = LiveConsole(coordinator.url, api, topic, group, idle_group, members)
        for member in members:
            await member.start()

        async def shared_and_lag_known() -> bool:
            description = await console.describe()
            owned = owners(description)
            lags = [partition["lag"] for partition in description["partitions"]]
            shared = len(owned) == MEMBERS and all(owned.values())
            return shared and lags == [LAG]

        try:
            await until(shared_and_lag_known, 30, "three members sharing the partition")
            yield console
        finally:
            for member in members:
                await member.stop()
