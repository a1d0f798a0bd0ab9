"""What the chaos suite's worker and streams members run journals each call as the ledger
reads it, fails poison records, and lets the runner slow down exactly as many calls as it
asks (the members are real processes; here the module is loaded on its own)."""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.chaos.ledger import read_crashes, read_finals, read_journal


class Record:
    def __init__(self, offset: int, value: bytes = b"") -> None:
        self.partition = 0
        self.offset = offset
        self.key = b"k%d" % offset
        self.value = value


@pytest.fixture
def targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("CHAOS_JOURNAL", str(tmp_path / "m0.jsonl"))
    monkeypatch.setenv("CHAOS_NAME", "m0")
    monkeypatch.setenv("CHAOS_WORK_MS", "0")
    monkeypatch.setattr("signal.signal", lambda *_: None)
    # Loaded afresh, as a member process loads it, with this test's environment.
    monkeypatch.delitem(sys.modules, "tests.chaos.targets", raising=False)
    loaded = importlib.import_module("tests.chaos.targets")
    yield loaded
    os.close(loaded._JOURNAL)
    for handler in list(logging.getLogger("client").handlers):
        if isinstance(handler, loaded._LossJournal):
            logging.getLogger("client").removeHandler(handler)


def test_a_call_is_journaled_and_a_loss_starts_a_new_membership(
    targets: Any, tmp_path: Path
) -> None:
    targets.handle(Record(0))
    logging.getLogger("client.consumer").warning("slices lost")
    targets.handle(Record(1))
    with pytest.raises(ValueError, match="poison"):
        targets.handle(Record(2, targets.POISON))
    runs, _ = read_journal(tmp_path / "m0.jsonl")
    assert [(run.offset, run.outcome, run.generation) for run in runs] == [
        (0, "done", 1),
        (1, "done", 2),
        (2, "error", 2),
    ]


def test_only_as_many_calls_as_asked_sleep(targets: Any, tmp_path: Path) -> None:
    control = {"id": 1, "until": time.monotonic() + 60, "calls": 2, "sleep_s": 0.2}
    (tmp_path / "m0.jsonl.control").write_text(json.dumps(control))
    slept = []
    for offset in range(4):
        started = time.monotonic()
        targets.handle(Record(offset))
        slept.append(time.monotonic() - started >= 0.2)
    assert slept == [True, True, False, False]
    # A call starting after the window is not slowed, whatever is left to claim.
    control = {"id": 2, "until": time.monotonic() - 1, "calls": 2, "sleep_s": 0.2}
    (tmp_path / "m0.jsonl.control").write_text(json.dumps(control))
    started = time.monotonic()
    targets.handle(Record(9))
    assert time.monotonic() - started < 0.2


def test_final_results_and_crashes_are_journaled_for_the_windowed_checker(
    targets: Any, tmp_path: Path
) -> None:
    journal = [tmp_path / "m0.jsonl"]
    targets._journal_final("u1", {"start": 60_000, "end": 120_000, "views": 3})
    logging.getLogger("client.streams.outputs").error(
        "a send failed; nothing processed since the last commit is committed, and the "
        "instance stops"
    )
    logging.getLogger("client.consumer").warning("membership lost; rejoining")
    finals = read_finals(journal)
    assert [final[:4] for final in finals] == [("m0", "u1", 60_000, 3)]
    crashes = read_crashes(journal)["m0"]
    assert len(crashes) == 2
    assert all(at >= finals[0][4] for at in crashes)
