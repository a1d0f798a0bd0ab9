"""What windows promise whatever the number of instances (issue 46, item 6): retention is
never below what an open window needs, and a store shared by several key ranges never drops
a window one of them still needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from client.streams.dsl import session, tumbling
from tests.streams.test_dsl import windowed_app

MINUTE = 60_000


def test_a_retention_below_size_plus_grace_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match=r"size_ms 600000 \+ grace_ms 300000") as refused:
        tumbling(10 * MINUTE, grace_ms=5 * MINUTE, retention_ms=5 * MINUTE)
    assert "window size plus the grace period" in str(refused.value)
    with pytest.raises(ValueError, match=r"gap_ms 100 \+ grace_ms 10"):
        session(100, grace_ms=10, retention_ms=100)
    assert tumbling(10 * MINUTE, grace_ms=5 * MINUTE, retention_ms=15 * MINUTE)


def test_the_least_retention_keeps_a_window_open_for_its_grace(tmp_path: Path) -> None:
    # The review's probe: 0, 9:59, 10:00, 9:50 (within grace), 20:00.
    windows = tumbling(10 * MINUTE, grace_ms=5 * MINUTE, retention_ms=15 * MINUTE)
    run = windowed_app(windows, final=True, tmp_path=tmp_path)
    for stamp in (0, 9 * MINUTE + 59_000, 10 * MINUTE, 9 * MINUTE + 50_000, 20 * MINUTE):
        run.send("views", b"k", b"{}", stamp)
    emitted = [json.loads(value or b"") for _, value in run.out["out"]]
    assert emitted == [[0, 10 * MINUTE, 3]]
