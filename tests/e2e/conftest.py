"""The coordinator the end-to-end tests talk to, shared by their modules."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from tests.e2e.harness import SESSION_TIMEOUT_MS
from tests.fixtures.coordinator import MakeDatabase, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def coordinator(
    make_migrated_database: MakeDatabase,
    kafka_bootstrap: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[str]:
    """The coordinator as operators run it (``python -m coordinator serve``), in its own
    process so members and coordinator do not share one event loop, with short sessions and
    heartbeats so dead members are noticed within seconds."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("coordinator") / "coordinator.log"
    env = dict(os.environ)
    env.update(
        KEYRANGE_DATABASE_URL=await make_migrated_database(),
        KEYRANGE_KAFKA_BOOTSTRAP=kafka_bootstrap,
        KEYRANGE_HOST="127.0.0.1",
        KEYRANGE_PORT=str(port),
        KEYRANGE_MIGRATE_ON_START="false",
        KEYRANGE_LOG_LEVEL="WARNING",
        KEYRANGE_LOG_FORMAT="text",
        KEYRANGE_SESSION_TIMEOUT_MIN_MS="500",
        KEYRANGE_SESSION_TIMEOUT_DEFAULT_MS=str(SESSION_TIMEOUT_MS),
        KEYRANGE_HEARTBEAT_INTERVAL_MS="200",
        KEYRANGE_REAPER_INTERVAL_MS="100",
        KEYRANGE_METADATA_REFRESH_MS="500",
    )
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "coordinator",
            "serve",
            env=env,
            cwd=REPO_ROOT,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url) as api:
            for _ in range(300):
                if process.returncode is not None:
                    raise RuntimeError(f"coordinator exited: {log_path.read_text()[-3000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await api.get("/readyz")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError(f"coordinator not ready: {log_path.read_text()[-3000:]}")
        yield url
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 20)
            except TimeoutError:
                process.kill()
                await process.wait()
        problems = [line for line in log_path.read_text().splitlines() if "ERROR" in line]
        if problems:
            print(f"\ncoordinator log has {len(problems)} ERROR lines, see {log_path}")
