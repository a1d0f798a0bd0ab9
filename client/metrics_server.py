"""Prometheus metrics on an optional port, for the runtimes of a process (``keyrange worker``,
``keyrange streams``). prometheus-client comes with their extras; the SDK itself never needs
it, so it is imported here only when a port is asked for.

The HTTP server answers on a thread of its own, on ``host`` (loopback unless told: it has no
authentication); each scrape asks the event loop for the runtime's figures, so nothing reads
the runtime's structures while the loop changes them. Taking them is a copy of counters, no
I/O and no store reads, so a scrape costs the loop microseconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

# A scrape waits this long for the loop; a loop this busy is worth a failed scrape.
_SNAPSHOT_TIMEOUT_S = 5.0


class MetricsUnavailable(Exception):
    """prometheus-client is not installed, or the port cannot be listened on."""


@dataclass(frozen=True)
class Family:
    """One metric and its samples (label values, value), as a runtime reports it."""

    name: str
    help: str
    kind: Literal["counter", "gauge"] = "gauge"
    labels: tuple[str, ...] = ()
    samples: Sequence[tuple[tuple[str, ...], float]] = ()


class MetricsServer:
    """Serves ``/metrics`` on ``host:port`` until ``close``; ``families`` runs on ``loop`` at
    each scrape. ``extra`` names the package extra that brings prometheus-client."""

    def __init__(
        self,
        port: int,
        families: Callable[[], list[Family]],
        loop: asyncio.AbstractEventLoop,
        *,
        extra: str,
        host: str = "127.0.0.1",
    ) -> None:
        try:
            from prometheus_client import start_http_server
            from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
            from prometheus_client.registry import Collector, CollectorRegistry
        except ImportError:
            raise MetricsUnavailable(
                f"metrics need prometheus-client: pip install 'keyrange[{extra}]'"
            ) from None

        async def take() -> list[Family]:
            return families()

        class RuntimeCollector(Collector):
            def collect(self) -> Iterator[Any]:
                current = asyncio.run_coroutine_threadsafe(take(), loop).result(_SNAPSHOT_TIMEOUT_S)
                for family in current:
                    kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
                    metric = kind(family.name, family.help, labels=list(family.labels))
                    for labels, value in family.samples:
                        metric.add_metric(list(labels), value)
                    yield metric

        registry = CollectorRegistry()
        registry.register(RuntimeCollector())
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as error:
            raise MetricsUnavailable(f"cannot serve metrics on {host}:{port}: {error}") from None

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
