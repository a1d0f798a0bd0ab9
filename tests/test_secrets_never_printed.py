"""Secrets never printed: whatever is wrong with the settings, ``keyrange serve`` and
``keyrange migrate`` name the variable at fault and never print a password or a token."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SECRET = "pw-9f3c-never-shown"

# (variable, value, the variable the error must name; None: a failure past the settings)
CASES = [
    pytest.param(
        "KEYRANGE_DATABASE_URL",
        f"mysql://keyrange:{SECRET}@db/k",
        "KEYRANGE_DATABASE_URL",
        id="url-of-another-database",
    ),
    pytest.param(
        "KEYRANGE_DATABASE_URL",
        f"postgresql://keyrange:{SECRET}@db:port/k",
        "KEYRANGE_DATABASE_URL",
        id="url-with-a-bad-port",
    ),
    pytest.param(
        "KEYRANGE_DATABASE_URL",
        f"postgresql://keyrange@db:{SECRET}/k",
        "KEYRANGE_DATABASE_URL",
        id="password-where-the-port-goes",
    ),
    pytest.param("KEYRANGE_ADMIN_TOKENS", SECRET, "admin_tokens", id="admin-tokens-not-json"),
    pytest.param(
        "KEYRANGE_ADMIN_TOKENS",
        f'[{{"token": "{SECRET}"}}]',
        "KEYRANGE_ADMIN_TOKENS[0]",
        id="admin-token-as-an-object",
    ),
    pytest.param(
        "KEYRANGE_CLIENT_TOKENS",
        f'[{{"token": ["{SECRET}"]}}]',
        "KEYRANGE_CLIENT_TOKENS[0].token",
        id="client-token-as-a-list",
    ),
    pytest.param(
        "KEYRANGE_CLIENT_TOKENS",
        f'[{{"token": "{SECRET}", "group_prefixes": "team-a."}}]',
        "KEYRANGE_CLIENT_TOKENS[0].group_prefixes",
        id="client-token-beside-a-bad-field",
    ),
    pytest.param(
        "KEYRANGE_DATABASE_URL",
        f"postgresql://keyrange:{SECRET}@127.0.0.1:1/k",
        None,
        id="database-not-reachable",
    ),
]


def run_keyrange(
    command: str, variable: str, value: str, cwd: Path
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KEYRANGE_")}
    environment.update(
        {
            variable: value,
            # Nothing embedded is started: a broker nobody listens on, data in the test's dir.
            "KEYRANGE_KAFKA_BOOTSTRAP": "127.0.0.1:1",
            "KEYRANGE_DATA_DIR": str(cwd / "data"),
            "KEYRANGE_PORT": "1",
        }
    )
    if variable != "KEYRANGE_DATABASE_URL":
        environment["KEYRANGE_DATABASE_URL"] = "postgresql://keyrange@127.0.0.1:1/k"
    return subprocess.run(
        [sys.executable, "-m", "coordinator", command],
        env=environment,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("command", ["serve", "migrate"])
@pytest.mark.parametrize(("variable", "value", "named"), CASES)
def test_no_settings_error_prints_a_secret(
    command: str, variable: str, value: str, named: str | None, tmp_path: Path
) -> None:
    result = run_keyrange(command, variable, value, tmp_path)
    printed = result.stdout + result.stderr
    assert result.returncode != 0, printed
    assert SECRET not in printed
    if named is not None:
        assert result.returncode == 2
        assert "keyrange: invalid settings:" in result.stderr
        assert named in result.stderr
        assert "Traceback" not in printed
