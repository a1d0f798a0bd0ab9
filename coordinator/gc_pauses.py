"""How long the garbage collector stopped the process, as ``keyrange_gc_pause_seconds``.

A collection stops the event loop: every request of the replica waits for it. At 10,000
waiting members a young collection walks every container allocated since the last one that
is still alive, a few hundred thousand objects, and one such pause is a held reply's or a
hand-off's whole tail (bench/history/2026-11-27-issue-29-part-3-round-9.md). Python's own
metrics count collections but do not time them.

The collector calls back in the middle of an allocation, so the callback only adds to plain
counters; the histogram is built from them when ``/metrics`` is scraped.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import REGISTRY, Collector

BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
_GENERATIONS = 3


class CollectorPauses(Collector):
    """Collections timed by generation, exported as a Prometheus histogram."""

    def __init__(self) -> None:
        # Per generation: a count per bucket (the last is +Inf), and the pauses' sum.
        self._counts = [[0] * (len(BUCKETS_S) + 1) for _ in range(_GENERATIONS)]
        self._sums = [0.0] * _GENERATIONS
        self._started = 0.0

    def on_collection(self, phase: str, info: dict[str, int]) -> None:
        """``gc.callbacks``' signature."""
        if phase == "start":
            self._started = time.perf_counter()
            return
        paused = time.perf_counter() - self._started
        generation = info["generation"]
        bucket = 0
        while bucket < len(BUCKETS_S) and paused > BUCKETS_S[bucket]:
            bucket += 1
        self._counts[generation][bucket] += 1
        self._sums[generation] += paused

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "keyrange_gc_pause_seconds",
            "Garbage-collector collections by generation, timed: each stops the event loop",
            labels=["generation"],
        )
        for generation in range(_GENERATIONS):
            cumulative = 0
            buckets: list[tuple[str, float]] = []
            for bound, count in zip(
                (*map(str, BUCKETS_S), "+Inf"), self._counts[generation], strict=True
            ):
                cumulative += count
                buckets.append((bound, cumulative))
            family.add_metric([str(generation)], buckets, self._sums[generation])
        yield family


_PAUSES = CollectorPauses()


def time_collections() -> None:
    """Time this process's collections from now on; once per process, however many apps
    it serves."""
    if _PAUSES.on_collection not in gc.callbacks:
        gc.callbacks.append(_PAUSES.on_collection)
        REGISTRY.register(_PAUSES)
