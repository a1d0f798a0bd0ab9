"""No module over 600 lines and no class over 300 in the shipped code: past that a file or a
class does more than one job, and splitting it later by job costs more than keeping it small."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parent.parent
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300
SHIPPED = ("coordinator", "client", "migrations", "examples", "bench")


def _oversized() -> dict[str, int]:
    found: dict[str, int] = {}
    for package in SHIPPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            text = path.read_text()
            lines = len(text.splitlines())
            if lines > MAX_MODULE_LINES:
                found[name] = lines
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.ClassDef):
                    assert node.end_lineno is not None
                    size = node.end_lineno - node.lineno + 1
                    if size > MAX_CLASS_LINES:
                        found[f"{name}:{node.name}"] = size
    return found


def test_no_module_or_class_is_over_its_size() -> None:
    assert _oversized() == {}
