"""Every coordinator setting is documented in the README, so no knob is invisible."""

from __future__ import annotations

import inspect
import re
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


def test_every_make_target_the_docs_name_exists() -> None:
    """A merge once dropped two bench targets the docs still told users to run."""
    root = Path(__file__).parent.parent
    makefile = (root / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, flags=re.MULTILINE))
    texts = [
        root / "README.md",
        root / "bench" / "README.md",
        *sorted((root / "docs").glob("*.md")),
    ]
    named = {
        target for text in texts for target in re.findall(r"`make ([a-z][a-z-]*)", text.read_text())
    }
    assert named, "the docs name no make target: the pattern no longer matches them"
    assert named - targets == set()
