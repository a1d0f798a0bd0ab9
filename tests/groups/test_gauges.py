"""The metrics loop exports how many IC ranges the store holds, the figure to alert on."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from coordinator import metrics
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
