"""Every coordinator setting is documented in the README, so no knob is invisible."""

from __future__ import annotations

from pathlib import Path

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
