"""Lag less the records committed individually, and the age of each partition's oldest
unprocessed record read from Kafka, in the admin API, its gauge, and cached between views."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from coordinator.kafka_records import RecordTimestamps
from tests.admin.conftest import FIRST_TIMESTAMP_MS, RECORDS, CliCluster
from tests.fixtures.coordinator import MakeDatabase, RunningCoordinator
from tests.waiting import until

# The coordinator reads the wall clock a moment before the test does; records are a second
# apart, so this still tells the record at the stable offset from its neighbours.
SLACK_S = 0.9


def _expected_age(stable_offset: int) -> float:
    return time.time() - (FIRST_TIMESTAMP_MS + stable_offset * 1000) / 1000


async def _partitions(cluster: CliCluster, group: str) -> dict[int, dict[str, Any]]:
    reply = await cluster.api.get(f"/v1/admin/groups/{group}/offsets")
    assert reply.status_code == 200, reply.text
    return {p["partition"]: p for p in reply.json()["partitions"]}


async def test_lag_leaves_out_offsets_committed_individually(cli_cluster: CliCluster) -> None:
    group = cli_cluster.group("age-ic")
    await cli_cluster.commit(group, 0, ranges=[[0, 2], [7, 8]])
    (partition,) = (await _partitions(cli_cluster, group)).values()
    assert (partition["stable_offset"], partition["ic_offsets"]) == (3, 2)
    assert partition["lag"] == RECORDS - 3 - 2


async def test_the_oldest_unprocessed_record_is_the_one_at_the_stable_offset(
    cli_cluster: CliCluster,
) -> None:
    group = cli_cluster.group("age")
    await cli_cluster.commit(group, 0, offset=12)
    await cli_cluster.commit(group, 1, offset=RECORDS)
    partitions = await _partitions(cli_cluster, group)
    age = partitions[0]["oldest_unprocessed_age_seconds"]
    assert age == pytest.approx(_expected_age(12), abs=SLACK_S)
    # Caught up: nothing is unprocessed, so there is no age to give.
    assert partitions[1]["lag"] == 0
    assert partitions[1]["oldest_unprocessed_age_seconds"] is None
    described = await cli_cluster.api.get(f"/v1/admin/groups/{group}")
    shown = {p["partition"]: p for p in described.json()["partitions"]}
    assert shown[0]["oldest_unprocessed_age_seconds"] == pytest.approx(
        _expected_age(12), abs=SLACK_S
    )


async def test_views_of_an_unmoved_stable_offset_read_kafka_once(
    cli_cluster: CliCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = cli_cluster.group("age-cache")
    await cli_cluster.commit(group, 0, offset=20)
    reads: list[object] = []
    original = RecordTimestamps.first_at

    async def counted(self: RecordTimestamps, positions: Any) -> Any:
        reads.append(positions)
        return await original(self, positions)

    monkeypatch.setattr(RecordTimestamps, "first_at", counted)
    for _ in range(3):
        (partition,) = (await _partitions(cli_cluster, group)).values()
        assert partition["oldest_unprocessed_age_seconds"] is not None
    assert len(reads) == 1


async def test_the_age_is_a_per_partition_gauge(
    make_migrated_database: MakeDatabase,
    start_coordinator: Callable[..., Awaitable[RunningCoordinator]],
    kafka_bootstrap: str,
    cli_cluster: CliCluster,
) -> None:
    coordinator = await start_coordinator(
        await make_migrated_database(), kafka_bootstrap=kafka_bootstrap, metrics_group_labels=True
    )
    group = cli_cluster.group("age-gauge")
    async with httpx.AsyncClient(base_url=coordinator.url, timeout=10) as api:
        entries = [
            {"topic": cli_cluster.topic, "partition": 0, "offset": 5},
            {"topic": cli_cluster.topic, "partition": 1, "offset": RECORDS},
        ]
        reply = await api.post(f"/v1/groups/{group}/offsets/commit", json={"partitions": entries})
        assert reply.status_code == 200, reply.text

        async def gauges() -> dict[str, float]:
            text = (await api.get("/metrics")).text
            found = {}
            for line in text.splitlines():
                if line.startswith("keyrange_partition_oldest_unprocessed_age_seconds{") and (
                    f'group_id="{group}"' in line
                ):
                    partition = line.split('partition="')[1].split('"')[0]
                    found[partition] = float(line.rsplit(" ", 1)[1])
            return found

        async def both() -> bool:
            return len(await gauges()) == 2

        await until(both, 30, "the age gauges of both partitions")
        found = await gauges()
    assert found["0"] == pytest.approx(_expected_age(5), abs=SLACK_S)
    assert found["1"] == 0


async def test_the_lag_gauge_leaves_out_offsets_committed_individually(
    make_migrated_database: MakeDatabase,
    start_coordinator: Callable[..., Awaitable[RunningCoordinator]],
    kafka_bootstrap: str,
    cli_cluster: CliCluster,
) -> None:
    """``keyrange_partition_lag`` counts what is not processed yet, as the admin API does:
    offsets committed individually above the stable offset are processed."""
    coordinator = await start_coordinator(
        await make_migrated_database(), kafka_bootstrap=kafka_bootstrap, metrics_group_labels=True
    )
    group = cli_cluster.group("lag-gauge")
    async with httpx.AsyncClient(base_url=coordinator.url, timeout=10) as api:
        for entry in (
            {"topic": cli_cluster.topic, "partition": 0, "offset": 5},
            {"topic": cli_cluster.topic, "partition": 0, "ranges": [[8, 9], [12, 12]]},
        ):
            reply = await api.post(
                f"/v1/groups/{group}/offsets/commit", json={"partitions": [entry]}
            )
            assert reply.status_code == 200, reply.text

        async def lag() -> float | None:
            for line in (await api.get("/metrics")).text.splitlines():
                if line.startswith("keyrange_partition_lag{") and f'group_id="{group}"' in line:
                    return float(line.rsplit(" ", 1)[1])
            return None

        async def exported() -> bool:
            return await lag() is not None

        await until(exported, 30, "the partition's lag gauge")
        assert await lag() == RECORDS - 5 - 3
