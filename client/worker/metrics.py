"""Prometheus metrics of a worker on an optional port: records processed, failed, retried,
dead-lettered and skipped, records in flight, buffered bytes, paused partitions and the lag
of every owned slice. prometheus-client comes with the ``worker`` extra (``pip install
'keyrange[worker]'``); the SDK itself never needs it.

The HTTP server answers on a thread of its own; each scrape asks the event loop for a
snapshot, so nothing reads the engine's structures while the loop changes them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from client.worker.source import slice_lag

if TYPE_CHECKING:
    from client.worker.engine import WorkerEngine

# A scrape waits this long for the loop; a loop this busy is worth a failed scrape.
_SNAPSHOT_TIMEOUT_S = 5.0


class MetricsUnavailable(Exception):
    """prometheus-client is not installed, or the port cannot be listened on."""


@dataclass(frozen=True)
class Snapshot:
    counters: dict[str, int]
    in_flight: int
    buffered_bytes: int
    paused: int
    lag: list[tuple[str, int, int, int, int]]


def snapshot(engine: WorkerEngine | None) -> Snapshot:
    if engine is None:
        return Snapshot({}, 0, 0, 0, [])
    stats = engine.stats
    return Snapshot(
        counters={
            "processed": stats.processed,
            "failed": stats.failed,
            "retried": stats.retried,
            "dead_lettered": stats.dead_lettered,
            "skipped": stats.skipped,
        },
        in_flight=engine.in_flight,
        buffered_bytes=engine.buffered_bytes,
        paused=len(engine.paused),
        lag=[
            (tp.topic, tp.partition, keys.start, keys.end, lag)
            for tp, keys, lag in slice_lag(engine.source)
        ],
    )


_COUNTER_HELP = {
    "processed": "Records acknowledged as processed.",
    "failed": "Failed attempts (a failure acknowledged, an exception, or a timeout).",
    "retried": "Attempts scheduled again after a failure (policy retry).",
    "dead_lettered": "Records written to the dead-letter topic and acknowledged by the broker.",
    "skipped": "Failed records marked processed without retry (policy skip).",
}


class MetricsServer:
    """Serves ``/metrics`` on ``port`` until ``close``."""

    def __init__(self, port: int, engine_of: Any, loop: asyncio.AbstractEventLoop) -> None:
        try:
            from prometheus_client import start_http_server
            from prometheus_client.core import (
                CounterMetricFamily,
                GaugeMetricFamily,
            )
            from prometheus_client.registry import Collector, CollectorRegistry
        except ImportError:
            raise MetricsUnavailable(
                "worker metrics need prometheus-client: pip install 'keyrange[worker]'"
            ) from None

        async def take() -> Snapshot:
            return snapshot(engine_of())

        class WorkerCollector(Collector):
            def collect(self) -> Iterator[Any]:
                current = asyncio.run_coroutine_threadsafe(take(), loop).result(_SNAPSHOT_TIMEOUT_S)
                for name, value in current.counters.items():
                    counter = CounterMetricFamily(
                        f"keyrange_worker_records_{name}", _COUNTER_HELP[name]
                    )
                    counter.add_metric([], value)
                    yield counter
                for name, text, value in (
                    (
                        "in_flight",
                        "Records handed to user code without an outcome yet.",
                        current.in_flight,
                    ),
                    (
                        "buffered_bytes",
                        "Bytes of records taken from Kafka and not finished.",
                        current.buffered_bytes,
                    ),
                    (
                        "paused_partitions",
                        "Partitions whose fetching is paused (backpressure).",
                        current.paused,
                    ),
                ):
                    gauge = GaugeMetricFamily(f"keyrange_worker_{name}", text)
                    gauge.add_metric([], value)
                    yield gauge
                lag = GaugeMetricFamily(
                    "keyrange_worker_slice_lag",
                    "Offsets between an owned slice's commit point and the partition's end.",
                    labels=["topic", "partition", "key_start", "key_end"],
                )
                for topic, partition, start, end, value in current.lag:
                    lag.add_metric([topic, str(partition), str(start), str(end)], value)
                yield lag

        registry = CollectorRegistry()
        registry.register(WorkerCollector())
        try:
            self._server, self._thread = start_http_server(port, registry=registry)
        except OSError as error:
            raise MetricsUnavailable(f"cannot serve metrics on port {port}: {error}") from None

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
