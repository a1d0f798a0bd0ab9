"""The short seeded chaos runs of the normal suite: the SDK's ``run()`` against every fault
kind it had first, in about a minute, against two coordinator replicas; then one short run
per runtime added since (``keyrange worker`` on threads and on processes, ``keyrange
streams``' word count and its windowed page views) against the new faults that break them
where they break. ``make chaos`` runs every runtime longer, against every kind, with one and
two replicas.

A failure prints the run's faults and verdict; replay it with
``python -m tests.chaos --seed <seed> --duration <s> --runs 1 --members <n> --replicas 2
--runtimes <runtime> --kinds <the test's fault kinds>``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coordinator.embedded import EmbeddedPostgres
from tests.chaos import faults as kinds
from tests.chaos.checker import report
from tests.chaos.members import STREAMS, STREAMS_WINDOWED, WORKER_PROCESSES, WORKER_THREADS
from tests.chaos.run import ChaosRun, Outcome, Shape, describe

# It starts a Postgres and a broker of its own (stopping them must not break other tests).
pytestmark = [pytest.mark.slow, pytest.mark.db, pytest.mark.kafka]

SEED = 3


async def chaos(shape: Shape, directory: Path) -> Outcome:
    async with EmbeddedPostgres(directory / "postgres") as postgres:
        outcome = await ChaosRun(shape, postgres=postgres, directory=directory).run()
    print(f"\n{describe(outcome)}")
    verdicts = {shape.runtime: [outcome.verdict]}
    faults = [[fault.kind for fault in outcome.faults]]
    shown = report(
        verdicts,
        faults,
        counting=frozenset({STREAMS}),
        windowed=frozenset({STREAMS_WINDOWED}),
    )
    print(json.dumps(shown))
    return outcome


def assert_kept_every_promise(outcome: Outcome) -> None:
    verdict = outcome.verdict
    assert verdict.lost == []
    assert verdict.unfinished == {}
    assert verdict.overlaps == []
    assert verdict.zombie_handouts == []
    assert verdict.order_violations == []
    assert verdict.excess_duplicates == []
    assert verdict.undercounted == []
    assert verdict.unexplained_surplus == []
    assert verdict.restore_mismatches == []
    assert verdict.regressions == []
    assert verdict.final_repeats == []
    assert verdict.ok
    assert outcome.coordinator_errors == []


async def test_a_short_seeded_run_loses_nothing_and_never_runs_a_key_twice_at_once(
    tmp_path: Path,
) -> None:
    shape = Shape(seed=SEED, duration_s=60, members=4, partitions=2, replicas=2, kinds=kinds.KINDS)
    outcome = await chaos(shape, tmp_path)
    assert {fault.kind for fault in outcome.faults} == set(kinds.KINDS)
    assert outcome.verdict.records > 1_000
    assert_kept_every_promise(outcome)


@pytest.mark.parametrize(
    ("runtime", "seed", "faults"),
    [
        (WORKER_THREADS, 1, (kinds.STUCK_HANDLER, kinds.SIGTERM_DRAIN)),
        (WORKER_PROCESSES, 1, (kinds.SLOW_CALLS, kinds.SIGTERM_DRAIN)),
        (STREAMS, 2, (kinds.STUCK_HANDLER, kinds.MEMBER_KILL, kinds.TWO_AT_ONCE)),
        (
            STREAMS_WINDOWED,
            2,
            (kinds.STUCK_HANDLER, kinds.MEMBER_KILL, kinds.COORDINATOR_LINK, kinds.TWO_AT_ONCE),
        ),
    ],
)
async def test_a_short_seeded_run_of_a_runtime_keeps_its_promises(
    runtime: str, seed: int, faults: tuple[str, ...], tmp_path: Path
) -> None:
    """A stuck call past the revoke (drain) timeout, a call past the processing timeout and
    a SIGTERM during a long call must not put a key in two places at once; the word count
    must lose no count through a stuck processor, a kill, or both at once; the page views'
    final windows must equal the reference through a stuck processor, a kill and a cut to
    the coordinator, none emitted twice but as docs/guarantees.md allows after a crash."""
    shape = Shape(
        seed=seed, duration_s=40, members=3, partitions=2, replicas=2, kinds=faults, runtime=runtime
    )
    outcome = await chaos(shape, tmp_path)
    assert {fault.kind for fault in outcome.faults} == set(faults) - {kinds.TWO_AT_ONCE}
    assert kinds.TWO_AT_ONCE not in faults or any(fault.pair for fault in outcome.faults)
    assert outcome.verdict.records > 500
    if runtime == STREAMS_WINDOWED:
        # Windows closed during the run, not only at its end.
        assert outcome.verdict.windows > 100
    assert_kept_every_promise(outcome)
