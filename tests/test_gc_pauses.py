"""The collector's pauses as ``keyrange_gc_pause_seconds`` (coordinator/gc_pauses.py)."""

from __future__ import annotations

import gc

import httpx
from fastapi import FastAPI
from prometheus_client import REGISTRY

from coordinator.gc_pauses import BUCKETS_S, CollectorPauses


def test_a_collection_is_counted_in_its_generation_and_its_bucket() -> None:
    pauses = CollectorPauses()
    pauses.on_collection("start", {"generation": 1})
    pauses.on_collection("stop", {"generation": 1, "collected": 0, "uncollectable": 0})

    (family,) = pauses.collect()
    samples = {
        (sample.name, sample.labels["generation"], sample.labels.get("le")): sample.value
        for sample in family.samples
    }
    assert samples[("keyrange_gc_pause_seconds_count", "1", None)] == 1
    assert samples[("keyrange_gc_pause_seconds_count", "0", None)] == 0
    assert samples[("keyrange_gc_pause_seconds_bucket", "1", "+Inf")] == 1
    # A pause of microseconds lands in the first bucket; every later one counts it too.
    for bound in BUCKETS_S:
        assert samples[("keyrange_gc_pause_seconds_bucket", "1", str(bound))] == 1
    assert 0 < samples[("keyrange_gc_pause_seconds_sum", "1", None)] < BUCKETS_S[0]


async def test_a_serving_coordinator_times_its_collections(
    coordinator_app: FastAPI, api: httpx.AsyncClient
) -> None:
    before = REGISTRY.get_sample_value("keyrange_gc_pause_seconds_count", {"generation": "2"})
    gc.collect()
    after = REGISTRY.get_sample_value("keyrange_gc_pause_seconds_count", {"generation": "2"})
    assert before is not None and after == before + 1
    scraped = (await api.get("/metrics")).text
    assert 'keyrange_gc_pause_seconds_bucket{generation="0",le="0.001"}' in scraped
