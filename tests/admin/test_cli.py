"""``keyrange admin`` against a real coordinator: where its options may go, and that its
errors name the coordinator they asked and the argument at fault."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest

from coordinator.cli import main
from tests.fixtures.coordinator import RunningCoordinator, free_port

StartCoordinator = Callable[..., Awaitable[RunningCoordinator]]


async def run_cli(*argv: str) -> int:
    """The CLI is synchronous; a thread keeps the coordinator on this loop serving it."""
    return await asyncio.to_thread(main, list(argv))


async def test_url_may_follow_the_admin_subcommand(
    start_coordinator: StartCoordinator, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    coordinator = await start_coordinator(database_url)
    code = await run_cli("admin", "config", "--url", coordinator.url)
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert json.loads(printed.out)["accept_individual_commit"] is True


async def test_a_rejected_argument_is_named_as_typed_with_the_coordinator_asked(
    start_coordinator: StartCoordinator, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    coordinator = await start_coordinator(database_url)
    code = await run_cli("admin", "--url", coordinator.url, "describe", "no spaces allowed")
    error = capsys.readouterr().err
    assert code == 1
    assert error.startswith(f"keyrange: {coordinator.url} answered INVALID_REQUEST: group_id: ")
    assert "path." not in error


async def test_an_unreachable_coordinator_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    code = await run_cli("admin", "groups", "--url", nowhere)
    assert code == 1
    assert capsys.readouterr().err.startswith(
        f"keyrange: cannot reach the coordinator at {nowhere}: "
    )
