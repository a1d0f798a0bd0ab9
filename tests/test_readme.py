"""Every coordinator setting is documented in the README, so no knob is invisible."""

from __future__ import annotations

import inspect
from pathlib import Path

from client import KeyrangeConsumer
from coordinator.settings import Settings

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_every_setting_is_in_the_readme() -> None:
    missing = [
        f"KEYRANGE_{name.upper()}"
        for name in Settings.model_fields
        if f"`KEYRANGE_{name.upper()}`" not in README
    ]
    assert missing == []


def test_readme_names_the_two_commands_ci_runs() -> None:
    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text()
    assert "make test" in README and "make run" in README
    assert "make test" in ci


def test_readme_states_the_consumers_offset_reset_default() -> None:
    """It differs from aiokafka's, so a Kafka user would otherwise assume the wrong one."""
    default = inspect.signature(KeyrangeConsumer).parameters["auto_offset_reset"].default
    assert f"`auto_offset_reset` defaults to `{default}`" in README
