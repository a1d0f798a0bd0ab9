"""Streams test fixtures: every `keyrange streams` process a test starts is killed at its
end, so a failing test leaves no instance behind in the group or in the temporary files."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from tests.streams.harness import StreamsProcess


@pytest_asyncio.fixture
async def spawned() -> AsyncIterator[list[StreamsProcess]]:
    processes: list[StreamsProcess] = []
    yield processes
    for process in processes:
        if process.process.returncode is None:
            process.process.kill()
            await process.process.wait()
