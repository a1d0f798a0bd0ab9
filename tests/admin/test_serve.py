"""``keyrange serve`` on a port in use fails before starting anything, naming the port; the
embedded broker's port is a setting with a stable default the README's commands name."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.cli import main
from coordinator.settings import Settings

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
