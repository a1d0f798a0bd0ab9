"""Members in processes of their own (``worker_process.py``), for the faults a task in the
test's event loop cannot suffer: SIGKILL, SIGSTOP, an event loop blocked by a handler."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

WORKER = Path(__file__).with_name("worker_process.py")
REPO_ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """One ``worker_process.py``; it stops cleanly (final commit, leave) when its stdin
    closes, and ``close`` kills it when it does not within the bound."""

    def __init__(
        self,
        *,
        bootstrap: str,
        coordinator: str,
        group: str,
        topic: str,
        session_timeout_ms: int,
        options: Sequence[str] = (),
    ) -> None:
        self.arguments = [
            "--bootstrap",
            bootstrap,
            "--coordinator",
            coordinator,
            "--group",
            group,
            "--topic",
            topic,
            "--session-timeout-ms",
            str(session_timeout_ms),
            *options,
        ]
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            *self.arguments,
            stdin=asyncio.subprocess.PIPE,
            cwd=REPO_ROOT,
        )

    def send_signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    async def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
        assert self.process is not None
        await self.process.wait()

    async def close(self, timeout_s: float = 30) -> int | None:
        """Close stdin and wait for a clean exit; the exit code, None if it had to be killed."""
        if self.process is None or self.process.returncode is not None:
            return None if self.process is None else self.process.returncode
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGCONT)
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            return await asyncio.wait_for(self.process.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
            return None
