"""A worker whose broker goes away logs what Keyrange knows, not a flood of Kafka client
lines (issue 47 item 6: ~40 aiokafka ERROR lines a second buried Keyrange's warnings)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from coordinator.embedded import EmbeddedBroker
from coordinator.kafka import ClusterMetadata
from tests.client.test_worker_cli import start_worker, worker_env
from tests.fixtures.coordinator import RunningCoordinator
from tests.waiting import until

QUIET_WINDOW_S = 8.0


async def test_a_lost_broker_is_a_few_lines_not_a_flood(
    database_url: str,
    start_coordinator: Callable[..., Awaitable[RunningCoordinator]],
    tmp_path: Path,
) -> None:
    broker = EmbeddedBroker(tmp_path / "broker")
    broker.start()
    try:
        coordinator = await start_coordinator(database_url, kafka_bootstrap=broker.bootstrap)
        coordinator_url = coordinator.url
        async with ClusterMetadata(broker.bootstrap) as cluster:
            await cluster.create_topic("orders", 1)
        env = worker_env("orders", f"g-{uuid.uuid4().hex[:8]}", broker.bootstrap, coordinator_url)
        process = await start_worker(
            "tests.client.worker_targets:handle",
            tmp_path / "journal",
            {**env, "KEYRANGE_WORKER_LOG_FORMAT": "json"},
        )
        lines: list[dict[str, object]] = []

        async def read() -> None:
            assert process.stderr is not None
            async for raw in process.stderr:
                try:
                    lines.append(json.loads(raw))
                except ValueError:
                    lines.append({"logger": "?", "msg": raw.decode()})

        reading = asyncio.create_task(read())
        try:
            await until(
                lambda: any(line.get("msg") == "slices assigned" for line in lines),
                60,
                "the worker to own its partition",
            )
            broker.stop()
            stopped_at, before = time.monotonic(), len(lines)
            await until(
                lambda: time.monotonic() - stopped_at > QUIET_WINDOW_S, 30, "a while broker-less"
            )
            after = lines[before:]
        finally:
            process.terminate()
            async with asyncio.timeout(60):
                await process.wait()
            await reading
    finally:
        broker.stop()
    kafka_lines = [line for line in after if str(line.get("logger", "")).startswith("aiokafka")]
    # Each kind of Kafka client line at most once per 10 s window: a handful, not hundreds.
    kinds = {(line["logger"], line.get("level")) for line in kafka_lines}
    assert len(kafka_lines) <= 2 * max(len(kinds), 1) + 4, [line.get("msg") for line in kafka_lines]
