from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from coordinator.embedded import EmbeddedBroker, EmbeddedPostgres, EmbeddedServiceError
from coordinator.kafka import ClusterMetadata


def process_alive(pid: int) -> bool:
    """Zombies count as gone: the stopped postmaster is reparented to init, which reaps it
    whenever it gets round to it."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state != "Z"


def _postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])


async def _scalar(url: str, query: str) -> object:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as connection:
            return (await connection.execute(text(query))).scalar_one()
    finally:
        await engine.dispose()


async def test_embedded_postgres_serves_sqlalchemy_and_asyncpg(
    embedded_postgres: EmbeddedPostgres,
) -> None:
    url = embedded_postgres.url()
    assert url.startswith("postgresql+asyncpg://")
    assert await _scalar(url, "SELECT current_database()") == "postgres"
    connection = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        assert await connection.fetchval("SELECT 40 + 2") == 42
    finally:
        await connection.close()


async def test_create_database_returns_a_usable_url_and_is_idempotent(
    embedded_postgres: EmbeddedPostgres,
) -> None:
    first = embedded_postgres.create_database("keyrange_embedded_idem")
    second = embedded_postgres.create_database("keyrange_embedded_idem")
    assert first == second
    assert await _scalar(first, "SELECT current_database()") == "keyrange_embedded_idem"


def test_create_database_refuses_names_that_need_quoting(
    embedded_postgres: EmbeddedPostgres,
) -> None:
    with pytest.raises(ValueError, match="must match"):
        embedded_postgres.create_database('x"; DROP DATABASE postgres; --')


@pytest.mark.db
async def test_data_survives_stop_and_start(tmp_path: Path) -> None:
    data_dir = tmp_path / "postgres"
    server = EmbeddedPostgres(data_dir)
    try:
        server.start()
        url = server.create_database("kept")
        engine = create_async_engine(url)
        async with engine.begin() as connection:
            await connection.execute(text("CREATE TABLE facts (value text)"))
            await connection.execute(text("INSERT INTO facts VALUES ('still here')"))
        await engine.dispose()
        pid = _postmaster_pid(data_dir)

        server.stop()
        assert not server.running
        assert not process_alive(pid)

        assert server.start() == server.url()
        assert _postmaster_pid(data_dir) != pid
        assert await _scalar(url, "SELECT value FROM facts") == "still here"
    finally:
        server.stop()
    assert not (data_dir / "postmaster.pid").exists()


def test_a_second_handle_reuses_the_server_and_leaves_it_running(
    embedded_postgres: EmbeddedPostgres,
) -> None:
    pid = _postmaster_pid(embedded_postgres.data_dir)
    second = EmbeddedPostgres(embedded_postgres.data_dir)
    assert second.start() == embedded_postgres.url()
    second.stop()
    assert embedded_postgres.running
    assert _postmaster_pid(embedded_postgres.data_dir) == pid


@pytest.mark.db
def test_postgres_that_cannot_start_explains_why(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    server = EmbeddedPostgres(blocker / "postgres")
    with pytest.raises(EmbeddedServiceError, match=r"could not start in .*a-file"):
        server.start()
    assert not server.running


async def test_broker_fixture_answers_metadata(kafka_bootstrap: str) -> None:
    async with ClusterMetadata(kafka_bootstrap) as cluster:
        assert isinstance(await cluster.list_topics(), set)


@pytest.mark.kafka
def test_broker_stops_completely_and_logs_to_its_directory(tmp_path: Path) -> None:
    with EmbeddedBroker(tmp_path / "broker") as broker:
        host, port = broker.bootstrap.split(":")
        pid = broker.pid
        assert pid is not None and process_alive(pid)
        with socket.create_connection((host, int(port)), timeout=2):
            pass
    assert not broker.running
    assert not process_alive(pid)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=2).close()
    assert "tansu" in (tmp_path / "broker" / "broker.log").read_text()
    broker.stop()


@pytest.mark.kafka
def test_broker_on_a_port_in_use_says_so_without_starting(tmp_path: Path) -> None:
    with socket.socket() as occupied:
        occupied.bind(("127.0.0.1", 0))
        occupied.listen()
        port = occupied.getsockname()[1]
        broker = EmbeddedBroker(tmp_path / "broker", port=port, start_timeout_s=10)
        with pytest.raises(
            EmbeddedServiceError, match=f"port {port} on 127.0.0.1 is already in use"
        ):
            broker.start()
    assert not broker.running
    assert broker.pid is None
    assert not (tmp_path / "broker" / "broker.log").exists()


@pytest.mark.kafka
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux")
def test_broker_dies_with_a_killed_parent(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from coordinator.embedded import EmbeddedBroker\n"
        "broker = EmbeddedBroker(sys.argv[1])\n"
        "broker.start()\n"
        "print(broker.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "broker")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        assert parent.stdout is not None
        broker_pid = int(parent.stdout.readline())
        assert process_alive(broker_pid)
    finally:
        parent.kill()
        parent.wait()
    deadline = time.monotonic() + 10
    while process_alive(broker_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(broker_pid)


@pytest.mark.kafka
def test_a_crashed_broker_can_be_started_again(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path / "broker")
    try:
        broker.start()
        first_pid = broker.pid
        assert first_pid is not None
        os.kill(first_pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while broker.running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not broker.running
        broker.start()
        assert broker.running and broker.pid != first_pid
    finally:
        broker.stop()
    assert not process_alive(first_pid)
