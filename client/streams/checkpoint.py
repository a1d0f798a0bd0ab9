"""Local checkpoints of changelog offsets, per (store, partition): for each key range, the
changelog offset below which the local store holds every entry of that range. A range with a
checkpoint restores from its offset, others from the changelog's start."""

from __future__ import annotations

import json
import os
from pathlib import Path

from client.protocol.keyspace import KeyRange

Checkpoint = dict[KeyRange, int]


def read_checkpoint(path: Path) -> Checkpoint:
    try:
        document = json.loads(path.read_text())
        return {KeyRange.from_json(entry["keys"]): int(entry["offset"]) for entry in document}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def write_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Atomic: a crash leaves the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    document = [
        {"keys": keys.to_json(), "offset": offset} for keys, offset in sorted(checkpoint.items())
    ]
    temporary.write_text(json.dumps(document))
    os.replace(temporary, path)


def start_offset(checkpoint: Checkpoint, keys: KeyRange) -> int | None:
    """Where restoring ``keys`` starts, when checkpointed ranges cover them all: the lowest
    offset of those ranges (records of a range already past it are applied again, in order,
    which leaves the same values)."""
    pieces = sorted(
        (covered, offset) for covered, offset in checkpoint.items() if covered.overlaps(keys)
    )
    reached = keys.start - 1
    for covered, _ in pieces:
        if covered.start > reached + 1:
            return None
        reached = max(reached, covered.end)
    if reached < keys.end:
        return None
    return min(offset for _, offset in pieces)
