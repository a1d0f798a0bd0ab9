"""Faults as they happened: what the runner did, corrected by what the journals show (a
blocked loop lasts as long as the block; a stuck call's fault begins with the call)."""

from __future__ import annotations

import dataclasses
import math

from tests.chaos import faults as kinds
from tests.chaos import members as runtimes
from tests.chaos.faults import FaultRecord
from tests.chaos.ledger import Block, HandlerRun


def with_actual_blocks(records: list[FaultRecord], blocks: list[Block]) -> list[FaultRecord]:
    """A blocked loop's fault lasts from when the handler blocked to when it returned, which
    the member's journal knows (the signal only asks the next handler to block)."""
    actual = []
    for record in records:
        if record.kind == kinds.LOOP_BLOCK:
            block = next(
                (b for b in blocks if b.process == record.target and b.ended >= record.started),
                None,
            )
            if block is not None:
                record = dataclasses.replace(record, started=block.started, ended=block.ended)
        actual.append(record)
    return actual


def spans_of(records: list[FaultRecord], kind: str) -> dict[str, list[tuple[float, float]]]:
    """When each member process suffered a fault of ``kind`` (a SIGSTOP, a cut link)."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for record in records:
        if record.kind == kind:
            spans.setdefault(record.target, []).append((record.started, record.ended))
    return spans


def from_stuck_calls(records: list[FaultRecord], runs: list[HandlerRun]) -> list[FaultRecord]:
    """A stuck or long call's fault starts with the call (the runner asked for it, at the
    fault's start or once joining members had started): then a processor that blocked the
    event loop counts as frozen mid-call."""
    actual = []
    for record in records:
        if record.kind in (kinds.STUCK_HANDLER, kinds.SIGTERM_DRAIN):
            call = next(
                (
                    run
                    for run in sorted(runs, key=lambda run: run.started)
                    if run.process == record.target
                    and record.started <= run.started <= record.ended
                    and (run.ended or math.inf) - run.started >= runtimes.STUCK_S
                ),
                None,
            )
            if call is not None:
                record = dataclasses.replace(record, started=call.started)
        actual.append(record)
    return actual
