"""The Jinja environment of the console and docs pages, and where their own assets live."""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape

STATIC_DIR = Path(__file__).parent / "static"
STATIC_FILES = {
    "console.js": "text/javascript",
    "console.css": "text/css",
}

templates = Environment(
    loader=PackageLoader("coordinator.ui", "templates"),
    autoescape=select_autoescape(default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
templates.filters["thousands"] = lambda value: f"{value:,}"
templates.filters["percent"] = lambda fraction: f"{fraction * 100:.1f}%"
templates.filters["at"] = lambda fraction: f"{fraction * 1000:.3f}"
templates.filters["seconds"] = lambda seconds: f"{seconds:,.1f} s"
