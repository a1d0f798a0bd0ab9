"""``make chaos``: seeded chaos runs, each with an embedded broker of its own, on a Postgres
of their own.

    python -m tests.chaos --seed 7 --duration 180 --runs 2 --runtimes run,streams

Every runtime (``--runtimes``, all by default: ``run``, ``worker-threads``,
``worker-processes``, ``streams``, ``streams-windowed``; ``tests/chaos/members.py``) gets
``--runs`` runs of its own, one after another. Run ``i`` uses seed ``seed + i`` and
alternates one and two coordinator replicas. Each run's faults and verdict go to stderr; the
last stdout line is the figures, one JSON object, with an entry per runtime under
``runtimes``. The exit status is 1 when a promise broke (a record or a count lost, a key in
two places at once, a zombie hand-out, a key out of order, a surplus no double processing
explains, a changelog that restores other counts than the sink's, a window's final result
missing, below or above the reference, or emitted twice outside the documented crash case).
Replay a run with its seed, runtime and the same shape options.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
from pathlib import Path

from coordinator.embedded import EmbeddedPostgres
from tests.chaos.checker import Verdict, report
from tests.chaos.members import RUNTIMES, STREAMS, STREAMS_WINDOWED
from tests.chaos.run import ChaosRun, Outcome, Shape, describe


async def main(args: argparse.Namespace) -> int:
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="keyrange-chaos-") as scratch:
        root = Path(args.keep or scratch)
        with EmbeddedPostgres(root / "postgres") as postgres:
            for runtime in args.runtimes.split(","):
                for index in range(args.runs):
                    shape = Shape(
                        seed=args.seed + index,
                        duration_s=args.duration,
                        members=args.members,
                        partitions=args.partitions,
                        replicas=1 + index % 2 if args.replicas == 0 else args.replicas,
                        rate_per_s=args.rate,
                        runtime=runtime,
                        kinds=tuple(args.kinds.split(",")) if args.kinds else (),
                    )
                    directory = root / f"{runtime}-{shape.seed}"
                    run = ChaosRun(shape, postgres=postgres, directory=directory)
                    outcomes.append(await run.run())
                    print(describe(outcomes[-1]), file=sys.stderr, flush=True)
    by_runtime: dict[str, list[Verdict]] = {}
    for outcome in outcomes:
        by_runtime.setdefault(outcome.shape.runtime, []).append(outcome.verdict)
    shown = report(
        by_runtime,
        [[f.kind for f in o.faults] for o in outcomes],
        counting=frozenset({STREAMS}),
        windowed=frozenset({STREAMS_WINDOWED}),
    )
    print(json.dumps(shown))
    broken = any(not o.verdict.ok for o in outcomes)
    return 1 if broken else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--duration", type=float, default=180.0, help="seconds per run")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=0, help="0 alternates 1 and 2")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="records per second (0: the runtime's own)"
    )
    parser.add_argument(
        "--runtimes", default=",".join(RUNTIMES), help="comma-separated, of " + ", ".join(RUNTIMES)
    )
    parser.add_argument(
        "--kinds", default="", help="comma-separated fault kinds (default: the runtime's all)"
    )
    parser.add_argument("--keep", help="keep journals and logs in this directory")
    logging.basicConfig(level=logging.WARNING)
    sys.exit(asyncio.run(main(parser.parse_args())))
