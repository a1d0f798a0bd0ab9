"""The first SIGTERM or SIGINT stops a worker or a streams application that is still
starting (here: waiting for a coordinator that does not answer), instead of being noted and
then ignored for the minute the start-up retries (issue 47)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from tests.waiting import until

ROOT = Path(__file__).resolve().parents[2]


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Started:
    """A `keyrange` process whose standard error is read as it comes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self._reading = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stderr is not None
        async for line in self.process.stderr:
            self.lines.append(line.decode())

    def said(self, words: str) -> bool:
        return any(words in line for line in self.lines)

    async def exit_code(self, within_s: float) -> int:
        async with asyncio.timeout(within_s):
            code = await self.process.wait()
            await self._reading
        return code


async def start(*argv: str, tmp_path: Path) -> Started:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "client.cli",
        *argv,
        cwd=ROOT,
        env={**os.environ, "WORDCOUNT_LINES": "lines"},
        stderr=asyncio.subprocess.PIPE,
    )
    return Started(process)


@pytest.mark.parametrize(
    "signal_number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"]
)
async def test_the_first_signal_stops_a_worker_waiting_for_the_coordinator(
    kafka_bootstrap: str, tmp_path: Path, signal_number: int
) -> None:
    coordinator = f"http://127.0.0.1:{unused_port()}"
    started = await start(
        "worker",
        "tests.client.worker_targets:handle",
        "--topics",
        "t",
        "--group",
        "g",
        "--bootstrap",
        kafka_bootstrap,
        "--coordinator",
        coordinator,
        tmp_path=tmp_path,
    )
    try:
        await until(lambda: started.said("did not answer"), 60, "the start-up to retry")
        started.process.send_signal(signal_number)
        # The start-up's retries last a minute; a stop that waits for them is the bug.
        assert await started.exit_code(within_s=20) == 0, started.lines
    finally:
        if started.process.returncode is None:
            started.process.kill()
    assert started.said("stopped before it started"), started.lines
    assert not started.said("second signal"), started.lines


async def test_the_first_signal_stops_a_streams_application_waiting_for_the_coordinator(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    coordinator = f"http://127.0.0.1:{unused_port()}"
    started = await start(
        "streams",
        "examples.streams_wordcount:build_topology",
        "--application-id",
        "stop-at-start",
        "--bootstrap",
        kafka_bootstrap,
        "--coordinator",
        coordinator,
        "--state-dir",
        str(tmp_path / "state"),
        tmp_path=tmp_path,
    )
    try:
        await until(lambda: started.said("did not answer"), 60, "the start-up to retry")
        started.process.send_signal(signal.SIGTERM)
        assert await started.exit_code(within_s=20) == 0, started.lines
    finally:
        if started.process.returncode is None:
            started.process.kill()
    assert started.said("stopped before it started"), started.lines
