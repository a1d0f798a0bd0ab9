"""Members in processes of their own (``worker_process.py``), for the faults a task in the
test's event loop cannot suffer: SIGKILL, SIGSTOP, an event loop blocked by a handler; and the
coordinator in a process of its own, for the same reasons."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

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
        log_path: Path | None = None,
    ) -> None:
        """``log_path``: where its output goes (appended to), else the test's own."""
        self.log_path = log_path
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
        with contextlib.ExitStack() as stack:
            log = None if self.log_path is None else stack.enter_context(self.log_path.open("ab"))
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(WORKER),
                *self.arguments,
                stdin=asyncio.subprocess.PIPE,
                stdout=log,
                stderr=log,
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


def coordinator_settings(
    database_url: str, kafka_bootstrap: str, *, session_timeout_ms: int
) -> dict[str, str]:
    """Short sessions and heartbeats so dead members are noticed within seconds."""
    return {
        "KEYRANGE_DATABASE_URL": database_url,
        "KEYRANGE_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "KEYRANGE_MIGRATE_ON_START": "false",
        "KEYRANGE_LOG_LEVEL": "WARNING",
        "KEYRANGE_LOG_FORMAT": "text",
        "KEYRANGE_SESSION_TIMEOUT_MIN_MS": "500",
        "KEYRANGE_SESSION_TIMEOUT_DEFAULT_MS": str(session_timeout_ms),
        "KEYRANGE_HEARTBEAT_INTERVAL_MS": "200",
        "KEYRANGE_REAPER_INTERVAL_MS": "100",
        "KEYRANGE_METADATA_REFRESH_MS": "500",
    }


class CoordinatorProcess:
    """The coordinator as operators run it (``python -m coordinator serve``) on a fixed
    loopback port, so it can be killed and started again where its members look for it.
    ``settings`` are ``KEYRANGE_*`` variables; the log goes to ``log_path``, appended to
    across restarts."""

    def __init__(self, settings: dict[str, str], *, port: int, log_path: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.env = {
            **os.environ,
            **settings,
            "KEYRANGE_HOST": "127.0.0.1",
            "KEYRANGE_PORT": str(port),
        }
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, ready_within_s: float = 30) -> None:
        with self.log_path.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "coordinator",
                "serve",
                env=self.env,
                cwd=REPO_ROOT,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
            )
        deadline = time.monotonic() + ready_within_s
        async with httpx.AsyncClient(base_url=self.url) as api:
            while time.monotonic() < deadline:
                if self.process.returncode is not None:
                    raise RuntimeError(f"coordinator exited: {self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await api.get("/readyz")).status_code == 200:
                        return
                await asyncio.sleep(0.1)
        raise RuntimeError(f"coordinator not ready within {ready_within_s} s: {self.log_tail()}")

    async def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()

    async def stop(self, timeout_s: float = 20) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        self.process.terminate()
        try:
            await asyncio.wait_for(self.process.wait(), timeout_s)
        except TimeoutError:
            await self.kill()

    def log_tail(self, characters: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-characters:]

    def error_lines(self) -> list[str]:
        """Lines logged at ERROR, in either log format (text writes the level in lower case)."""
        return [
            line
            for line in self.log_path.read_text(errors="replace").splitlines()
            if "ERROR" in line or line.startswith("error ")
        ]
