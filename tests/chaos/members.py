"""The runtimes a chaos run drives, and their member processes.

- ``run``: ``tests/e2e/worker_process.py``, the SDK's ``run(handler, max_concurrency=4)``,
  revoke timeout 1 s;
- ``worker-threads`` and ``worker-processes``: ``keyrange worker tests.chaos.targets:handle``
  on a pool of 4 threads or of 2 processes, ``retry`` (3 attempts) with a dead-letter topic,
  drain timeout 1 s, processing timeout 5 s;
- ``streams``: ``keyrange streams tests.chaos.targets:word_count``, the word count;
- ``streams-windowed``: ``keyrange streams tests.chaos.targets:page_views``, the DSL page
  views per user in 1-minute tumbling windows with final results (RocksDB window store),
  fed views whose event time runs ahead of the wall clock so windows close during the run.

Each member runs in a session of its own, so a kill or a freeze strikes a worker's pool
children with it, as it strikes a pod's processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.chaos import faults as kinds
from tests.e2e.processes import REPO_ROOT, WORKER

RUN = "run"
WORKER_THREADS = "worker-threads"
WORKER_PROCESSES = "worker-processes"
STREAMS = "streams"
STREAMS_WINDOWED = "streams-windowed"
# The runtimes whose processors run on the event loop and that keep counts in stores.
STREAMS_RUNTIMES = frozenset({STREAMS, STREAMS_WINDOWED})

# run() and the workers' revoke (drain) timeout; a stuck call outlasts it.
REVOKE_TIMEOUT_S = 1.0
# The workers' processing timeout; a slow call outlasts it, a stuck one does not.
PROCESSING_TIMEOUT_S = 5.0
STUCK_S = 4.0
SLOW_S = 8.0
# How long calls keep starting stuck (or slow) after the runner asked for it.
STUCK_WINDOW_S = 1.0
COMMIT_INTERVAL_MS = 200
# The page views' windows (the example's minute), and how far event time moves per view:
# at the runtime's rate a window closes every 5 s of the run.
WINDOW_MS = 60_000
VIEW_STEP_MS = 300


@dataclass(frozen=True)
class Runtime:
    """What a runtime's members run and which faults they meet; ``concurrency`` is how
    many records one member may have in user code at once."""

    name: str
    kinds: tuple[str, ...]
    concurrency: int
    # Records (lines, for the word count) per second.
    rate_per_s: float


_MEMBER_FAULTS = tuple(kind for kind in kinds.RUNTIME_KINDS if kind != kinds.SLOW_CALLS)
RUNTIMES = {
    RUN: Runtime(RUN, (*kinds.KINDS, *_MEMBER_FAULTS, kinds.TWO_AT_ONCE), 4, 100.0),
    WORKER_THREADS: Runtime(
        WORKER_THREADS, (*kinds.KINDS, *kinds.RUNTIME_KINDS, kinds.TWO_AT_ONCE), 4, 100.0
    ),
    WORKER_PROCESSES: Runtime(
        WORKER_PROCESSES, (*kinds.KINDS, *kinds.RUNTIME_KINDS, kinds.TWO_AT_ONCE), 4, 100.0
    ),
    STREAMS: Runtime(STREAMS, (*kinds.KINDS, *_MEMBER_FAULTS, kinds.TWO_AT_ONCE), 1, 30.0),
    STREAMS_WINDOWED: Runtime(
        STREAMS_WINDOWED, (*kinds.KINDS, *_MEMBER_FAULTS, kinds.TWO_AT_ONCE), 1, 40.0
    ),
}


@dataclass(frozen=True)
class Place:
    """Where a run's members work: the topics, the group, the session, the files."""

    bootstrap: str
    group: str
    topic: str
    session_ms: int
    directory: Path
    work_ms: float
    block_ms: float
    # The word count's other topics, the page views' final results, and the workers'
    # dead-letter topic.
    words: str = ""
    counts: str = ""
    finals: str = ""
    dead_letters: str = ""

    def journal(self, name: str) -> Path:
        return self.directory / f"{name}.jsonl"


def command(runtime: str, name: str, coordinator: str, place: Place) -> list[str]:
    """The member's command line."""
    if runtime == RUN:
        return [
            sys.executable,
            str(WORKER),
            *("--bootstrap", place.bootstrap, "--coordinator", coordinator),
            *("--group", place.group, "--topic", place.topic),
            *("--session-timeout-ms", str(place.session_ms)),
            *("--journal", str(place.journal(name)), "--name", name),
            *("--work-ms", str(place.work_ms), "--concurrency", str(RUNTIMES[RUN].concurrency)),
            *("--block-ms", str(place.block_ms), "--revoke-timeout-s", str(REVOKE_TIMEOUT_S)),
        ]
    common = [
        *("--bootstrap", place.bootstrap, "--coordinator", coordinator),
        *("--session-timeout-ms", str(place.session_ms)),
        *("--commit-interval-ms", str(COMMIT_INTERVAL_MS), "--log-format", "json"),
    ]
    if runtime in STREAMS_RUNTIMES:
        return [
            *(sys.executable, "-m", "client.cli", "streams"),
            "tests.chaos.targets:word_count"
            if runtime == STREAMS
            else "tests.chaos.targets:page_views",
            *("--application-id", place.group, "--instance-id", name),
            *("--state-dir", str(place.directory / f"state-{name}")),
            *common,
        ]
    pool = ["--threads", "4"] if runtime == WORKER_THREADS else ["--processes", "2"]
    return [
        *(sys.executable, "-m", "client.cli", "worker", "tests.chaos.targets:handle"),
        *("--topics", place.topic, "--group", place.group),
        *("--max-concurrency", str(RUNTIMES[runtime].concurrency), *pool),
        *("--failure-policy", "retry", "--max-attempts", "3"),
        *("--retry-backoff", "0.2", "--retry-backoff-max", "1"),
        *("--dead-letter-topic", place.dead_letters),
        *("--drain-timeout", str(REVOKE_TIMEOUT_S)),
        *("--processing-timeout", str(PROCESSING_TIMEOUT_S)),
        *common,
    ]


def environment(name: str, place: Place) -> dict[str, str]:
    return {
        **os.environ,
        "CHAOS_JOURNAL": str(place.journal(name)),
        "CHAOS_NAME": name,
        "CHAOS_WORK_MS": str(place.work_ms),
        "CHAOS_BLOCK_MS": str(place.block_ms),
        "WORDCOUNT_LINES": place.topic,
        "WORDCOUNT_WORDS": place.words,
        "WORDCOUNT_COUNTS": place.counts,
        "PAGEVIEWS_INPUT": place.topic,
        "PAGEVIEWS_OUTPUT": place.finals,
        "PAGEVIEWS_WINDOW_MS": str(WINDOW_MS),
    }


class Member:
    """One member process. ``run`` members stop when their stdin closes, the others on
    SIGTERM (as a container platform stops them). ``exits`` lists when the process was
    seen to end, on the monotonic clock the journals use."""

    def __init__(
        self, name: str, runtime: str, argv: Sequence[str], env: dict[str, str], log: Path
    ) -> None:
        self.name = name
        self.runtime = runtime
        self.argv = list(argv)
        self.env = env
        self.log_path = log
        self.process: asyncio.subprocess.Process | None = None
        self.exits: list[float] = []

    async def start(self) -> Member:
        with self.log_path.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=log,
                stderr=log,
                cwd=REPO_ROOT,
                env=self.env,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def signal(self, signum: int) -> None:
        """To the member's main process only (SIGUSR1 blocks its event loop)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)

    def signal_all(self, signum: int) -> None:
        """To the member and its pool's children (a node freeze, an OOM kill of the pod)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signum)

    async def kill(self) -> None:
        self.signal_all(signal.SIGKILL)
        self.exits.append(time.monotonic())
        assert self.process is not None
        await self.process.wait()

    def ask_to_stop(self) -> None:
        assert self.process is not None
        if self.runtime == RUN:
            if self.process.stdin is not None:
                self.process.stdin.close()
        else:
            self.signal(signal.SIGTERM)

    async def stop(self, timeout_s: float = 30) -> int | None:
        """A graceful stop; the exit code, None when it had to be killed."""
        if self.process is None or self.process.returncode is not None:
            return None if self.process is None else self.process.returncode
        self.signal_all(signal.SIGCONT)
        self.ask_to_stop()
        return await self.wait(timeout_s)

    def last_line(self) -> str:
        lines = self.log_path.read_text(errors="replace").strip().splitlines()
        return lines[-1][:300] if lines else ""

    async def wait(self, timeout_s: float) -> int | None:
        assert self.process is not None
        try:
            code = await asyncio.wait_for(self.process.wait(), timeout_s)
        except TimeoutError:
            await self.kill()
            return None
        self.exits.append(time.monotonic())
        # A pool's child outliving its parent is the parent's to stop; here it would only
        # hold the run's files open.
        self.signal_all(signal.SIGKILL)
        return code
