"""The restore's progress bar, with the real `keyrange streams` command: a person watching a
terminal sees how far a long restore got, while a log collector reading a pipe gets JSON
lines only, never a bar's carriage returns. ``show_progress`` is left to its default, which
is "stderr is a terminal"."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.services import MakeTopic
from tests.streams.harness import (
    ROOT,
    WORDCOUNT_TARGET,
    StreamsProcess,
    TopicReader,
    WordCountRun,
    batch,
    produce,
    streams_command,
    truth_of,
    wordcount_topics,
)
from tests.waiting import until

pytestmark = pytest.mark.slow

# One drawing of the bar: it is redrawn in place, each time after a carriage return.
BAR = re.compile(r"\rrestoring counts\[0\] \[([#-]{30})\] +(\d+\.\d)% read (\d+) restored (\d+)")


class Terminal:
    """A `keyrange streams` process whose stderr is a pseudo-terminal; what it wrote there is
    read as it comes (a terminal nobody reads would block the writer once full)."""

    def __init__(self) -> None:
        self._controller, self._terminal_end = os.openpty()
        self.written = bytearray()
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, command: list[str], env: dict[str, str]) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *command,
            cwd=ROOT,
            env={**os.environ, **env},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=self._terminal_end,
        )
        os.close(self._terminal_end)
        asyncio.get_running_loop().add_reader(self._controller, self._read)

    def _read(self) -> None:
        try:
            chunk = os.read(self._controller, 65536)
        except OSError:  # EIO: every writer has closed the terminal
            chunk = b""
        if chunk:
            self.written += chunk
        else:
            asyncio.get_running_loop().remove_reader(self._controller)

    def text(self) -> str:
        return self.written.decode(errors="replace")

    def logs(self) -> list[dict[str, Any]]:
        """The JSON log lines between the bar's redraws."""
        entries = []
        for line in re.split(r"[\r\n]+", self.text()):
            if "{" in line:
                entries.append(json.loads(line[line.index("{") :]))
        return entries

    def about_restores(self) -> list[str]:
        """What was drawn and logged about restores, one piece per carriage return or line."""
        return [
            line
            for line in re.split(r"[\r\n]+", self.text())
            if "restoring " in line or '"store restored"' in line
        ]

    def restores(self) -> list[dict[str, Any]]:
        return [entry for entry in self.logs() if entry.get("msg") == "store restored"]

    async def stop(self, sig: int) -> int:
        assert self.process is not None
        self.process.send_signal(sig)
        return await asyncio.wait_for(self.process.wait(), 60)

    def close(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._controller)
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
        os.close(self._controller)


async def test_a_restore_draws_a_progress_bar_on_a_terminal_and_none_into_a_pipe(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    spawned: list[StreamsProcess],
) -> None:
    lines, words, counts = await wordcount_topics(make_topic, coordinator_url)
    run = WordCountRun(spawned, kafka_bootstrap, coordinator_url, lines, words, counts)
    produced = batch(0, 60)
    truth = truth_of(produced)
    await produce(kafka_bootstrap, lines, produced)
    # A first run counts every word: with the record cache (the default), one changelog
    # record per word per commit, so at most one per word counted.
    first = await run.start(tmp_path / "first")
    async with TopicReader(kafka_bootstrap, counts) as reader:

        async def counted() -> bool:
            await reader.poll()
            return reader.latest() == dict(truth)

        await until(counted, 60, "every word counted")
    assert await first.stop(signal.SIGTERM) == 0
    async with TopicReader(kafka_bootstrap, f"{run.app_id}-counts-changelog") as logged:
        changelog = len(await logged.read_to_end())
    assert len(truth) <= changelog <= sum(truth.values())

    # Into a pipe, with no state: the whole changelog is restored, and no bar drawn.
    piped = await run.start(tmp_path / "pipe")
    await until(piped.restores, 60, "the store restored into the pipe")
    # On a terminal, with no state, beside it: a part of the key space is restored, under a
    # bar that shows what the restore read and how much of it was the part's.
    terminal = Terminal()
    try:
        await terminal.start(
            streams_command(
                WORDCOUNT_TARGET, run.app_id, kafka_bootstrap, coordinator_url, tmp_path / "tty"
            ),
            run.env,
        )
        await until(terminal.restores, 60, "the store restored on the terminal")
        assert await terminal.stop(signal.SIGTERM) == 0
    finally:
        terminal.close()
    assert await piped.stop(signal.SIGTERM) == 0

    assert [
        (entry["records_read"], entry["records_restored"]) for entry in piped.restores()[:1]
    ] == [(changelog, changelog)]
    assert not [entry for entry in piped.logs if "restoring" in str(entry.get("msg"))]

    restores = [(entry["records_read"], entry["records_restored"]) for entry in terminal.restores()]
    assert restores and 0 < restores[0][1] < restores[0][0] == changelog
    text = terminal.text()
    bars = list(BAR.finditer(text))
    # Each restore's last drawing is the whole bar with its counts, and ends its line (the
    # terminal turns the newline into a carriage return and a line feed); the drawings of
    # one restore only go forward.
    finished = [bar for bar in bars if text[bar.end() :].startswith("\r\n")]
    assert [bar.groups() for bar in finished] == [
        ("#" * 30, "100.0", str(read), str(restored)) for read, restored in restores
    ], terminal.about_restores()
    drawn: list[int] = []
    for bar in bars:
        drawn.append(int(bar.group(3)))
        assert drawn == sorted(drawn), terminal.about_restores()
        if bar in finished:
            drawn = []
