"""The coordinator the end-to-end tests talk to, shared by their modules."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.e2e.harness import SESSION_TIMEOUT_MS
from tests.e2e.processes import CoordinatorProcess, coordinator_settings
from tests.fixtures.coordinator import MakeDatabase, free_port


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def coordinator(
    make_migrated_database: MakeDatabase,
    kafka_bootstrap: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[str]:
    """The coordinator as operators run it, in its own process so members and coordinator do
    not share one event loop."""
    process = CoordinatorProcess(
        coordinator_settings(
            await make_migrated_database(), kafka_bootstrap, session_timeout_ms=SESSION_TIMEOUT_MS
        ),
        port=free_port(),
        log_path=tmp_path_factory.mktemp("coordinator") / "coordinator.log",
    )
    try:
        await process.start()
        yield process.url
    finally:
        await process.stop()
        problems = process.error_lines()
        if problems:
            print(f"\ncoordinator log has {len(problems)} ERROR lines, see {process.log_path}")
