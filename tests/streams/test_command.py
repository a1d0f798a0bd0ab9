"""`keyrange streams` refuses bad options and targets with one line and exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.streams.harness import ROOT


def streams(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coordinator.cli", "streams", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["examples.streams_wordcount:build_topology"], "missing --application-id"),
        (
            ["nowhere:build", "--application-id", "a", "--bootstrap", "b", "--coordinator", "c"],
            "cannot import nowhere",
        ),
        (
            [
                "examples.streams_join:Processor",
                "--application-id",
                "a",
                "--bootstrap",
                "b",
                "--coordinator",
                "c",
            ],
            "not a Topology",
        ),
        (
            [
                "examples.streams_join:build_topology",
                "--application-id",
                "bad id!",
                "--bootstrap",
                "b",
                "--coordinator",
                "c",
            ],
            "application_id",
        ),
        (
            ["examples.streams_join:build_topology", "--commit-interval-ms", "soon"],
            "--commit-interval-ms",
        ),
    ],
)
def test_bad_options_exit_2_with_one_line(argv: list[str], message: str) -> None:
    result = streams(*argv)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
