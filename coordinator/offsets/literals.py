"""The commit statements' text: the array literals they send and the state text they read
back (coordinator/offsets/repository.py says why both are text).

A batch's write literals are formatted by the C module ``coordinator.offsets._literals`` where
it is installed, else here in Python (``write_literals_in_python``, the reference the C module
is tested against); the rest is small enough to stay in Python.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter

from client.protocol.committed import CommittedOffsets
from coordinator.offsets.pacing import PARTITIONS_PER_TURN

try:
    from coordinator.offsets import _literals as native
except ImportError:  # installed without a C compiler: the literals are formatted in Python
    native = None  # type: ignore[assignment]

GroupPartitionKey = tuple[str, str, int]


def ranges_from_text(text: str) -> tuple[tuple[int, int], ...]:
    """An ``int8multirange`` in Postgres' text form, which is canonical: ``{}`` or
    ``{[a,b),[c,d)}``; an unbounded range, which no commit stores, is skipped as
    ``repository._ranges_from_db`` skips it."""
    if len(text) <= 2:
        return ()
    if "(" not in text and ",)" not in text:  # every range bounded: the bounds, in one split
        bounds = [int(bound) for bound in text[2:-2].replace("),[", ",").split(",")]
        return tuple(
            [(lower, upper - 1) for lower, upper in zip(bounds[::2], bounds[1::2], strict=True)]
        )
    ranges = []
    for part in text[2:-2].split("),["):
        lower, _, upper = part.partition(",")
        if lower and upper:
            ranges.append((int(lower), int(upper) - 1))
    return tuple(ranges)


def text_array(values: Sequence[str | None]) -> str:
    """A ``text[]`` literal: every element quoted, so none can be read as NULL or split.

    Each distinct value is quoted once: a batch's keys repeat a few group ids and topics."""
    quoted = {
        value: "NULL"
        if value is None
        else '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        for value in set(values)
    }
    return "{" + ",".join(map(quoted.__getitem__, values)) + "}"


def int_array(values: Iterable[int]) -> str:
    return "{" + ",".join(map(str, values)) + "}"


def key_arrays(ordered: Sequence[GroupPartitionKey]) -> tuple[str, str, str]:
    """(group, topic, partition) keys as the three array literals the statements unnest."""
    return (
        text_array([key[0] for key in ordered]),
        text_array([key[1] for key in ordered]),
        int_array([key[2] for key in ordered]),
    )


def _state_columns(states: Sequence[CommittedOffsets]) -> tuple[list[str], ...]:
    """New states as the texts of their IC ranges and of their three watermark columns, as
    Postgres writes them (``repository._STATE_TEXT``)."""
    ranges, starts, ends, offsets = [], [], [], []
    for state in states:
        ranges.append(_canonical_ranges(state))
        pieces = state.pieces
        if pieces:
            starts.append("{" + ",".join(map(str, map(_first, pieces))) + "}")
            ends.append("{" + ",".join(map(str, map(_second, pieces))) + "}")
            offsets.append("{" + ",".join(map(str, map(_third, pieces))) + "}")
        else:  # a slice's watermarks are dropped once the stable offset passes them
            starts.append("{}")
            ends.append("{}")
            offsets.append("{}")
    return ranges, starts, ends, offsets


def _canonical_ranges(state: CommittedOffsets) -> str:
    """The IC ranges of ``state`` as Postgres writes an ``int8multirange`` (``{[a,b),...}``),
    part of the state text ``repository.WrittenStates`` compares with what the next batch
    reads back."""
    return "{" + ",".join([f"[{start},{end + 1})" for start, end in state.ranges]) + "}"


# ``%`` and ``map`` format in C: a batch formats a few columns per partition.
_first, _second, _third = itemgetter(0), itemgetter(1), itemgetter(2)


def state_of_text(text: str, metadata: str | None) -> CommittedOffsets:
    """A row's state from its ``repository._STATE_TEXT`` and its metadata."""
    stable, ranges, starts, ends, offsets = text.split("|")
    return CommittedOffsets.of_pieces(
        int(stable),
        ranges_from_text(ranges),
        tuple(zip(_ints(starts), _ints(ends), _ints(offsets), strict=True))
        if len(starts) > 2
        else (),
        metadata,
    )


def _ints(text: str) -> list[int]:
    """A ``bigint[]`` in Postgres' text form, ``{}`` or ``{1,2}``."""
    return [int(number) for number in text[1:-1].split(",")] if len(text) > 2 else []


def sql_constant(literal: str) -> str:
    """``literal`` as an SQL string constant, in the escape form, which reads the same
    whatever ``standard_conforming_strings`` is."""
    return "E'" + literal.replace("\\", "\\\\").replace("'", "''") + "'"


async def write_literals(
    states: Mapping[GroupPartitionKey, CommittedOffsets],
) -> tuple[list[str], list[GroupPartitionKey], list[CommittedOffsets], list[str]]:
    """The write statement's nine array literals, the keys and states in the order they list
    them, and each state's text (``repository._STATE_TEXT``) in that order.

    Formatted by the C module ``coordinator.offsets._literals`` where it is installed, in one
    go (it formats a partition in well under a microsecond, so even a commit of the largest
    size holds the event loop up for a few milliseconds only); else by
    ``write_literals_in_python``, a turn at a time (``coordinator.offsets.pacing``).
    """
    ordered = sorted(states)
    ordered_states = [states[key] for key in ordered]
    if native is not None:
        literals, state_texts = native.write_literals(ordered, ordered_states)
    else:
        literals, state_texts = await write_literals_in_python(ordered, states)
    return literals, ordered, ordered_states, state_texts


async def write_literals_in_python(
    ordered: list[GroupPartitionKey], states: Mapping[GroupPartitionKey, CommittedOffsets]
) -> tuple[list[str], list[str]]:
    """``coordinator.offsets._literals.write_literals`` in Python, and the reference it is
    tested against."""
    columns: tuple[list[str], ...] = ([], [], [], [])
    for start in range(0, len(ordered), PARTITIONS_PER_TURN):
        if start:
            await asyncio.sleep(0)
        part = _state_columns([states[key] for key in ordered[start : start + PARTITIONS_PER_TURN]])
        for column, values in zip(columns, part, strict=True):
            column.extend(values)
    written = [states[key] for key in ordered]
    stables = [str(state.stable_offset) for state in written]
    literals = [
        *key_arrays(ordered),
        "{" + ",".join(stables) + "}",
        *['{"' + '","'.join(column) + '"}' for column in columns],
        text_array([state.metadata for state in written]),
    ]
    state_texts = ["|".join(texts) for texts in zip(stables, *columns, strict=True)]
    return literals, state_texts
