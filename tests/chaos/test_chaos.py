"""The short seeded chaos run of the normal suite: every fault kind once, in about a minute,
against two coordinator replicas (``make chaos`` runs longer, with one and two replicas).

A failure prints the run's faults and verdict; replay it with
``python -m tests.chaos --seed <seed> --duration 60 --runs 1 --members 4 --replicas 2``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coordinator.embedded import EmbeddedPostgres
from tests.chaos.checker import figures
from tests.chaos.faults import KINDS
from tests.chaos.run import ChaosRun, Shape, describe

# It starts a Postgres and a broker of its own (stopping them must not break other tests).
pytestmark = [pytest.mark.slow, pytest.mark.db, pytest.mark.kafka]

SEED = 3


async def test_a_short_seeded_run_loses_nothing_and_never_runs_a_key_twice_at_once(
    tmp_path: Path,
) -> None:
    shape = Shape(seed=SEED, duration_s=60, members=4, partitions=2, replicas=2)
    async with EmbeddedPostgres(tmp_path / "postgres") as postgres:
        run = ChaosRun(shape, postgres=postgres, directory=tmp_path)
        outcome = await run.run()
    print(f"\n{describe(outcome)}")
    print(json.dumps(figures([outcome.verdict], [[fault.kind for fault in outcome.faults]])))

    verdict = outcome.verdict
    assert {fault.kind for fault in outcome.faults} == set(KINDS)
    assert verdict.records > 1_000
    assert verdict.lost == []
    assert verdict.unfinished == {}
    assert verdict.overlaps == []
    assert verdict.zombie_handouts == []
    assert verdict.order_violations == []
    assert verdict.excess_duplicates == []
    assert outcome.coordinator_errors == []
