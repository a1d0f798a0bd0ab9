"""The ledger: every start and end of a handler in the member processes, as they wrote it to
their journals (``tests/e2e/worker_process.py --journal``), paired into handler runs and kept
in a table of the run's Postgres so a failing run can be queried after the fact."""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

KILLED = "killed"


@dataclass(frozen=True)
class HandlerRun:
    """One call of a member's handler on one record. ``generation`` counts the slices the
    process had lost before the hand-out; ``ended`` is None when the process died in it."""

    process: str
    member: str
    epoch: int
    generation: int
    partition: int
    offset: int
    key: str
    started: float
    ended: float | None
    outcome: str
    wall_started: float
    wall_ended: float | None
    # How many times its process had given slices up before the hand-out: a key revoked and
    # granted back starts a new run of it, from the group's committed point.
    releases: int = 0

    @property
    def incarnation(self) -> tuple[str, str, int]:
        return (self.process, self.member, self.generation)


@dataclass(frozen=True)
class Block:
    """A handler that blocked its process's event loop, from ``started`` to ``ended``."""

    process: str
    started: float
    ended: float


def read_journal(path: Path) -> tuple[list[HandlerRun], list[Block]]:
    """Pair each end with the start of the same record in the same process; a start with no
    end is a handler the process died in. A torn last line (SIGKILL mid-write) is skipped.

    A start without a generation (``tests/chaos/targets.py``: a handler cannot see its
    membership) gets the number of ``boot`` and ``lost`` events its process journaled
    before it: each starts a membership."""
    runs: list[HandlerRun] = []
    blocks: list[Block] = []
    open_starts: dict[tuple[int, int], dict[str, object]] = {}
    ends: list[tuple[dict[str, object], dict[str, object] | None]] = []
    markers: dict[str, list[float]] = {}
    releases: dict[str, list[float]] = {}
    # When a pool child of a process was seen gone, by (process, pid).
    gone: dict[tuple[object, object], list[dict[str, object]]] = {}
    for event in _events(path):
        if event["e"] == "child_gone":
            gone.setdefault((event["p"], event.get("pid")), []).append(event)
            continue
        if event["e"] == "blocked":
            blocks.append(Block(event["p"], event["s"], event["t"]))
            continue
        if event["e"] in ("boot", "lost"):
            markers.setdefault(event["p"], []).append(event["t"])
            continue
        if event["e"] == "released":
            releases.setdefault(event["p"], []).append(event["t"])
            continue
        if event["e"] not in ("start", "end"):
            continue
        slot = (event["pt"], event["o"])
        if event["e"] == "start":
            open_starts[slot] = event
            continue
        start = open_starts.pop(slot, None)
        if start is not None:
            ends.append((start, event))
    for start in open_starts.values():
        # A call whose pool child was killed or died ran until the parent saw it gone.
        seen = gone.get((start["p"], start.get("pid")), []) if "pid" in start else []
        after = [event for event in seen if float(event["t"]) >= float(start["t"])]  # type: ignore[arg-type]
        ends.append((start, {**after[0], "ok": KILLED} if after else None))
    for process_markers in [*markers.values(), *releases.values()]:
        process_markers.sort()
    for start, end in ends:
        moment = float(start["t"])  # type: ignore[arg-type]
        if start.get("g") is None:
            before = markers.get(str(start["p"]), [])
            start = {**start, "g": bisect.bisect_right(before, moment)}
        start = {**start, "r": bisect.bisect_right(releases.get(str(start["p"]), []), moment)}
        runs.append(_run(start, end=end))
    return runs, blocks


def read_splits(paths: Sequence[Path]) -> list[tuple[int, int]]:
    """Each time the word count split a line: its partition and offset, once per time."""
    return [
        (int(event["pt"]), int(event["o"]))
        for path in paths
        for event in _events(path)
        if event["e"] == "split"
    ]


def read_writes(paths: Sequence[Path]) -> list[tuple[str, str, int, float]]:
    """Each count the word count wrote: process, word, count, when its call ended."""
    return [
        (str(event["p"]), str(event["k"]), int(event["c"]), float(event["t"]))
        for path in paths
        for event in _events(path)
        if event["e"] == "end" and "c" in event
    ]


def read_finals(paths: Sequence[Path]) -> list[tuple[str, str, int, int, float]]:
    """Each final result the page views journaled on its way to the sink: process, user,
    window start, count, when."""
    return [
        (str(event["p"]), str(event["k"]), int(event["s"]), int(event["n"]), float(event["t"]))
        for path in paths
        for event in _events(path)
        if event["e"] == "final"
    ]


def read_crashes(paths: Sequence[Path]) -> dict[str, list[float]]:
    """When each process lost its session or stopped on a failed send: its tasks ended
    without a commit."""
    crashes: dict[str, list[float]] = {}
    for path in paths:
        for event in _events(path):
            if event["e"] in ("lost", "crashed"):
                crashes.setdefault(str(event["p"]), []).append(float(event["t"]))
    return crashes


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def _run(start: dict[str, object], *, end: dict[str, object] | None) -> HandlerRun:
    return HandlerRun(
        process=str(start["p"]),
        member=str(start.get("m") or ""),
        epoch=int(start.get("ep") or 0),  # type: ignore[call-overload]
        generation=int(start["g"]),  # type: ignore[call-overload]
        partition=int(start["pt"]),  # type: ignore[call-overload]
        offset=int(start["o"]),  # type: ignore[call-overload]
        key=str(start["k"]),
        started=float(start["t"]),  # type: ignore[arg-type]
        ended=None if end is None else float(end["t"]),  # type: ignore[arg-type]
        outcome=KILLED if end is None else str(end["ok"]),
        wall_started=float(start["w"]),  # type: ignore[arg-type]
        wall_ended=None if end is None else float(end["w"]),  # type: ignore[arg-type]
        releases=int(start.get("r") or 0),  # type: ignore[call-overload]
    )


_COLUMNS = [field.name for field in fields(HandlerRun)]
_CREATE = """
CREATE TABLE IF NOT EXISTS chaos_ledger (
    seed bigint NOT NULL,
    process text NOT NULL,
    member text NOT NULL,
    epoch integer NOT NULL,
    generation integer NOT NULL,
    partition integer NOT NULL,
    "offset" bigint NOT NULL,
    key text NOT NULL,
    started double precision NOT NULL,
    ended double precision,
    outcome text NOT NULL,
    wall_started double precision NOT NULL,
    wall_ended double precision,
    releases integer NOT NULL
)
"""


async def store(database_url: str, seed: int, runs: Iterable[HandlerRun]) -> list[HandlerRun]:
    """Write the run's ledger to ``chaos_ledger`` (replacing an earlier run of the same seed)
    and read it back: the checker judges what the table holds."""
    quoted = ", ".join(f'"{name}"' for name in _COLUMNS)
    values = ", ".join(f":{name}" for name in _COLUMNS)
    engine = create_async_engine(database_url)
    try:
        async with engine.begin() as connection:
            await connection.execute(text(_CREATE))
            await connection.execute(
                text("DELETE FROM chaos_ledger WHERE seed = :seed"), {"seed": seed}
            )
            rows = [dict(zip(_COLUMNS, astuple(run), strict=True)) | {"seed": seed} for run in runs]
            if rows:
                await connection.execute(
                    text(f"INSERT INTO chaos_ledger (seed, {quoted}) VALUES (:seed, {values})"),
                    rows,
                )
            stored = await connection.execute(
                text(f"SELECT {quoted} FROM chaos_ledger WHERE seed = :seed ORDER BY started"),
                {"seed": seed},
            )
            return [HandlerRun(*row) for row in stored]
    finally:
        await engine.dispose()


def read_journals(paths: Sequence[Path]) -> tuple[list[HandlerRun], list[Block]]:
    runs: list[HandlerRun] = []
    blocks: list[Block] = []
    for path in paths:
        more_runs, more_blocks = read_journal(path)
        runs.extend(more_runs)
        blocks.extend(more_blocks)
    return runs, blocks
