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


ROOT = Path(__file__).parent.parent
DESIGN = ROOT / "docs" / "design.md"
_CITING_SUFFIXES = {".py", ".md", ".pyi", ".c", ".toml", ".yaml", ".tpl", ".txt"}
_CITATION = re.compile(
    r"docs/design\.md((?:\s*(?:,|/|and|or)?\s*§[0-9]+[a-z]?(?:\.[0-9]+)?(?:-[0-9]+)?)+)"
)
_SECTION = re.compile(r"§([0-9]+)([a-z]?)(?:\.([0-9]+))?(?:-([0-9]+))?")


def _sources() -> list[Path]:
    skipped = {".venv", ".git", "node_modules", "keyrange.egg-info", ".mypy_cache", ".ruff_cache"}
    return [
        path
        for path in sorted(ROOT.rglob("*"))
        if path.suffix in _CITING_SUFFIXES
        and path.is_file()
        and not skipped & set(path.relative_to(ROOT).parts)
    ]


def _design_sections() -> dict[str, str]:
    """Each numbered section of the contract (``"3"``, ``"3a"``) with its text."""
    sections: dict[str, str] = {}
    current = None
    for line in DESIGN.read_text().splitlines():
        heading = re.match(r"#{2,3} ([0-9]+[a-z]?)\. ", line)
        if heading:
            current = heading.group(1)
            sections[current] = ""
        elif line.startswith("## "):
            current = None
        elif current is not None:
            sections[current] += line + "\n"
    return sections


def _cited(section: str, sub: str, rule: str | None, sections: dict[str, str]) -> bool:
    if section + sub not in sections:
        return False
    # "§3.7": rule 7 of the numbered list in §3.
    return rule is None or re.search(rf"^{rule}\. ", sections[section + sub], re.M) is not None


def test_every_citation_of_the_contract_names_a_section_it_has() -> None:
    """Code and docs cite the contract as "docs/design.md §N"; a renumbered or removed
    section would leave them pointing at nothing."""
    sections = _design_sections()
    assert {"1", "2", "3", "3a", "4", "5", "6", "7", "8"} <= sections.keys()
    citations = 0
    dangling = []
    for path in _sources():
        for match in _CITATION.finditer(path.read_text(errors="replace")):
            for section, sub, rule, last in _SECTION.findall(match.group(1)):
                citations += 1
                named = (
                    [section] if not last else [str(n) for n in range(int(section), int(last) + 1)]
                )
                if not all(_cited(n, sub, rule or None, sections) for n in named):
                    dangling.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert citations > 30, "the pattern no longer finds the citations"
    assert dangling == []


def test_nothing_cites_the_contract_outside_the_repository() -> None:
    """The contract once lived in a file beside the repository, DESIGN.md, and was cited by
    that name and a section number: whoever had only the repository could not follow those."""
    bare = [
        str(path.relative_to(ROOT))
        for path in _sources()
        if re.search(r"\bDESIGN(\.md)? §", path.read_text(errors="replace"))
    ]
    assert bare == []
