"""The metrics loop exports how many IC ranges the store holds, the figure to alert on."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from coordinator import metrics
from coordinator.groups import metadata_repository
from coordinator.groups.loops import _GaugeLabels, update_gauges


async def test_stored_ic_ranges_gauge_counts_every_partition(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    await update_gauges(coordinator_app.state.engine, None, _GaugeLabels())
    before = metrics.IC_RANGES_STORED._value.get()
    reply = await api.post(
        "/v1/groups/gauge/offsets/commit",
        json={
            "partitions": [
                {"topic": "t", "partition": 0, "ranges": [[5, 6], [9, 9]]},
                {"topic": "t", "partition": 1, "ranges": [[3, 3]]},
            ]
        },
    )
    assert reply.status_code == 200
    await update_gauges(coordinator_app.state.engine, None, _GaugeLabels())
    assert metrics.IC_RANGES_STORED._value.get() == before + 3


async def test_the_aggregate_gauges_count_groups_and_live_members(
    api: httpx.AsyncClient, coordinator_app: FastAPI
) -> None:
    for group_id in ("aggregate-a", "aggregate-b"):
        reply = await api.post(
            f"/v1/groups/{group_id}/heartbeat",
            json={"member_epoch": 0, "subscribed_topics": ["t"], "session_timeout_ms": 60_000},
        )
        assert reply.status_code == 200, reply.text
    async with coordinator_app.state.engine.connect() as connection:
        groups = await metadata_repository.group_count(connection)
        members = sum((await metadata_repository.live_member_counts(connection)).values())

    # Set and read with no await between: other apps in this process share the gauges.
    await update_gauges(coordinator_app.state.engine, None, _GaugeLabels())
    assert (metrics.GROUPS._value.get(), metrics.LIVE_MEMBERS._value.get()) == (groups, members)
    assert groups >= 2 and members >= 2
