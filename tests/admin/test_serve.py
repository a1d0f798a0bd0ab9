"""``keyrange serve`` on a port in use fails before starting anything, naming the port; the
embedded broker's port is a setting with a stable default the README's commands name; and
SIGTERM stops it with its embedded services, as Ctrl-C does."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from client.cli import main
from coordinator.settings import Settings
from tests.fixtures.coordinator import free_port
from tests.test_embedded import process_alive

README = (Path(__file__).parent.parent.parent / "README.md").read_text()


@pytest.fixture
def occupied() -> Iterator[int]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield int(listener.getsockname()[1])


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("DATABASE_URL", "KAFKA_BOOTSTRAP", "PORT", "HOST", "EMBEDDED_BROKER_PORT"):
        monkeypatch.delenv(f"KEYRANGE_{name}", raising=False)
    monkeypatch.setenv("KEYRANGE_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def test_serve_on_a_coordinator_port_in_use_starts_nothing(
    occupied: int, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--port", str(occupied)]) == 1
    error = capsys.readouterr().err
    assert f"port {occupied} on 127.0.0.1 is already in use, where the coordinator" in error
    assert "nothing was started" in error
    assert not data_dir.exists()


def test_serve_on_a_broker_port_in_use_starts_nothing(
    occupied: int,
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KEYRANGE_EMBEDDED_BROKER_PORT", str(occupied))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    assert main(["serve", "--port", str(free)]) == 1
    error = capsys.readouterr().err
    assert f"port {occupied} on 127.0.0.1 is already in use, where the embedded broker" in error
    assert f"KEYRANGE_KAFKA_BOOTSTRAP=127.0.0.1:{occupied}" in error
    assert not data_dir.exists()


def test_the_embedded_broker_port_is_stable_and_the_readme_names_it() -> None:
    port = Settings.model_fields["embedded_broker_port"].default
    assert port == 9092
    assert f"--bootstrap 127.0.0.1:{port}" in README


@pytest.mark.db
@pytest.mark.kafka
@pytest.mark.slow
def test_sigterm_stops_serve_and_its_embedded_services_as_ctrl_c_does(tmp_path: Path) -> None:
    port, broker_port = free_port(), free_port()
    environment = {
        name: value for name, value in os.environ.items() if not name.startswith("KEYRANGE_")
    }
    environment.update(
        KEYRANGE_DATA_DIR=str(tmp_path / "data"),
        KEYRANGE_PORT=str(port),
        KEYRANGE_EMBEDDED_BROKER_PORT=str(broker_port),
    )
    serve = subprocess.Popen(
        [sys.executable, "-m", "coordinator", "serve"],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not _ready(port):
            assert serve.poll() is None, serve.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "serve was not ready in 120 s"
            time.sleep(0.2)
        postmaster = int(
            (tmp_path / "data" / "postgres" / "postmaster.pid").read_text().split("\n", 1)[0]
        )

        serve.send_signal(signal.SIGTERM)
        _, stderr = serve.communicate(timeout=60)
    finally:
        if serve.poll() is None:
            serve.kill()

    assert serve.returncode == 0, stderr[-2000:]
    assert "stopped on SIGTERM" in stderr
    assert not (tmp_path / "data" / "postgres" / "postmaster.pid").exists()
    assert not process_alive(postmaster)
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", broker_port)) != 0, "the broker still listens"


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
