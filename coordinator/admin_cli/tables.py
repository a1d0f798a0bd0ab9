"""Aligned text tables, as kafka-consumer-groups prints them: upper-case headers, columns
separated by two spaces, numbers right-aligned, "-" where a value is unknown."""

from __future__ import annotations

from collections.abc import Sequence

Cell = str | int | float | bool | None


def cell_text(value: Cell) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Cell]]) -> str:
    """The rows under their headers; a number column is right-aligned so digits line up."""
    texts = [[cell_text(value) for value in row] for row in rows]
    numeric = [_is_number_column([row[i] for row in rows]) for i in range(len(headers))]
    widths = [
        max([len(header), *(len(row[i]) for row in texts)]) for i, header in enumerate(headers)
    ]
    lines = []
    for row in [list(headers), *texts]:
        cells = [
            text.rjust(width) if right else text.ljust(width)
            for text, width, right in zip(row, widths, numeric, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _is_number_column(values: Sequence[Cell]) -> bool:
    """Numbers, some perhaps unknown; a column of unknowns only is not one."""
    known = [value for value in values if value is not None]
    return bool(known) and all(
        isinstance(value, int | float) and not isinstance(value, bool) for value in known
    )
