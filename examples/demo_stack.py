"""The whole system on one machine, for the demo and the client benchmark: an embedded
Postgres, an embedded broker, the coordinator as its own process (as operators run it), and
a workload producer.

Children are started in their own session so a Ctrl-C reaches only the demo, which then stops
them in order (workers first, so they commit and leave while the coordinator still answers);
on Linux they are also told to die with the demo, so a killed demo leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import httpx
from aiokafka import AIOKafkaProducer

from coordinator.embedded import EmbeddedBroker, EmbeddedPostgres

REPO_ROOT = Path(__file__).resolve().parent.parent
_COORDINATOR_START_TIMEOUT_S = 60.0
_COORDINATOR_STOP_TIMEOUT_S = 15.0
# Linux prctl option: deliver a signal to the child when its parent exits.
_PR_SET_PDEATHSIG = 1
# Producer batches: big enough that a million records take a few seconds, well under the
# broker's default 1 MB message size limit.
_PRODUCE_BATCH_BYTES = 512 * 1024


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes a child get SIGTERM when the process that started it dies."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def hook() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    return hook


def spawn(
    command: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    stdin: int | None = None,
    stdout: int | IO[bytes] | None = None,
    stderr: int | IO[bytes] | None = None,
) -> subprocess.Popen[bytes]:
    """A child process in its own session, run from the repository root, dying with us."""
    return subprocess.Popen(
        list(command),
        cwd=REPO_ROOT,
        env=env,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
        preexec_fn=die_with_parent(),
    )


def stop_process(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM, then SIGKILL when it does not exit within ``timeout_s``."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


class Stack:
    """Embedded Postgres and broker under ``data_dir`` plus a coordinator process.

    ``coordinator_settings`` are ``KEYRANGE_*`` settings without the prefix (for example
    ``{"session_timeout_min_ms": "1000"}``); the demo shortens sessions and heartbeats so
    members that come and go are noticed within seconds.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        database: str,
        port: int,
        coordinator_settings: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.database = database
        self.port = port
        self.coordinator_url = f"http://127.0.0.1:{port}"
        self.coordinator_settings = dict(coordinator_settings or {})
        self.bootstrap = ""
        self.database_url = ""
        self.coordinator: subprocess.Popen[bytes] | None = None
        self._postgres = EmbeddedPostgres(data_dir / "postgres")
        self._broker = EmbeddedBroker(data_dir / "broker")
        self._coordinator_log: IO[bytes] | None = None

    @property
    def coordinator_log_path(self) -> Path:
        return self.data_dir / "coordinator.log"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._postgres.start()
        self.database_url = self._postgres.create_database(self.database)
        self.bootstrap = self._broker.start()
        env = dict(os.environ)
        env.update(
            KEYRANGE_DATABASE_URL=self.database_url,
            KEYRANGE_KAFKA_BOOTSTRAP=self.bootstrap,
            KEYRANGE_HOST="127.0.0.1",
            KEYRANGE_PORT=str(self.port),
            KEYRANGE_DATA_DIR=str(self.data_dir),
            KEYRANGE_LOG_LEVEL=env.get("KEYRANGE_LOG_LEVEL", "WARNING"),
        )
        for name, value in self.coordinator_settings.items():
            env[f"KEYRANGE_{name.upper()}"] = value
        self._coordinator_log = self.coordinator_log_path.open("ab")
        self.coordinator = spawn(
            [sys.executable, "-m", "coordinator", "serve"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._coordinator_log,
            stderr=subprocess.STDOUT,
        )
        self._wait_until_ready()

    def stop(self) -> None:
        """Coordinator, then broker, then Postgres; each step runs even if one fails."""
        try:
            if self.coordinator is not None:
                stop_process(self.coordinator, _COORDINATOR_STOP_TIMEOUT_S)
        finally:
            if self._coordinator_log is not None:
                self._coordinator_log.close()
            try:
                self._broker.stop()
            finally:
                self._postgres.stop()

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _wait_until_ready(self) -> None:
        assert self.coordinator is not None
        deadline = time.monotonic() + _COORDINATOR_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.coordinator.poll() is not None:
                raise RuntimeError(
                    f"the coordinator exited with code {self.coordinator.returncode}:\n"
                    + self._coordinator_log_tail()
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.coordinator_url}/readyz", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(
            "the coordinator was not ready in time:\n" + self._coordinator_log_tail()
        )

    def _coordinator_log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.coordinator_log_path.read_text().splitlines()[-lines:])
        return f"(no log at {self.coordinator_log_path})"


async def allow_range_fetch(coordinator_url: str, topic: str) -> None:
    """Let the coordinator split the topic's partitions by key (off by default,
    docs/design.md §4)."""
    async with httpx.AsyncClient(base_url=coordinator_url, timeout=10) as api:
        reply = await api.put(f"/v1/admin/topics/{topic}/config", json={"accept_range_fetch": True})
        reply.raise_for_status()


async def produce(
    bootstrap: str, topic: str, keys: Sequence[bytes], *, value_size: int = 64, partition: int = 0
) -> None:
    """Write one record per key, in order, to one partition, as fast as batches allow."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks=1,
        enable_idempotence=False,
        linger_ms=5,
        max_batch_size=_PRODUCE_BATCH_BYTES,
        max_request_size=2 * _PRODUCE_BATCH_BYTES,
    )
    await producer.start()
    try:
        padding = b"x" * max(value_size - 12, 0)
        pending = []
        batch = producer.create_batch()
        for index, key in enumerate(keys):
            value = b"%012d" % index + padding
            if batch.append(key=key, value=value, timestamp=None) is None:
                pending.append(await producer.send_batch(batch, topic, partition=partition))
                batch = producer.create_batch()
                batch.append(key=key, value=value, timestamp=None)
        if batch.record_count():
            pending.append(await producer.send_batch(batch, topic, partition=partition))
        for delivery in pending:
            await delivery
    finally:
        await producer.stop()


def zipf_keys(records: int, distinct: int, exponent: float, seed: int) -> list[bytes]:
    """Keys drawn from Zipf(``exponent``) over ``distinct`` keys: key-0 is the hottest."""
    weights = [1.0 / (rank**exponent) for rank in range(1, distinct + 1)]
    names = [b"key-%d" % rank for rank in range(distinct)]
    return random.Random(seed).choices(names, weights=weights, k=records)


def uniform_keys(records: int, distinct: int, seed: int) -> list[bytes]:
    draw = random.Random(seed).randrange
    return [b"key-%d" % draw(distinct) for _ in range(records)]


class WorkerProcess:
    """A ``examples.demo_worker`` child: its latest status line, and commands to it."""

    def __init__(self, name: str, options: Sequence[str]) -> None:
        self.name = name
        self.options = list(options)
        self.status: dict[str, Any] = {"name": name, "state": "starting", "processed": 0}
        # Its member id and key ranges when it last had them (both go once it has left).
        self.last_owned: list[list[int]] = []
        self.last_member_id: str | None = None
        self.process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self, stderr: IO[bytes] | int | None = None) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "examples.demo_worker",
            "--name",
            self.name,
            *self.options,
            cwd=REPO_ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        self._reader = asyncio.create_task(self._read(), name=f"status-{self.name}")

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def go(self) -> None:
        if self.process is not None and self.process.stdin is not None:
            self.process.stdin.write(b"go\n")

    async def stop(self, timeout_s: float = 30.0) -> int:
        """Close its stdin (a clean stop: commit, leave), SIGKILL if it hangs."""
        process = self.process
        if process is None:
            return 0
        if process.stdin is not None and not process.stdin.is_closing():
            process.stdin.close()
        try:
            code = await asyncio.wait_for(process.wait(), timeout_s)
        except TimeoutError:
            process.kill()
            code = await process.wait()
        if self._reader is not None:
            await self._reader
        return code

    def kill(self) -> None:
        """SIGKILL: the member dies without committing or leaving."""
        if self.alive:
            assert self.process is not None
            self.process.kill()

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        while line := await self.process.stdout.readline():
            with contextlib.suppress(ValueError):
                self.status = json.loads(line)
                if self.status.get("owned"):
                    self.last_owned = self.status["owned"]
                self.last_member_id = self.status.get("member_id") or self.last_member_id
        await self.process.wait()
        self.status = {**self.status, "state": "exited", "exit_code": self.process.returncode}
