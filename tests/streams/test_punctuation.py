"""Punctuation schedules fire in due order, once per advance, and stop when cancelled."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from client.streams.processor import STREAM_TIME, WALL_CLOCK
from client.streams.punctuation import Punctuations


def fire(schedules: Punctuations, kind: object, now: int) -> list[str]:
    fired = []
    for entry, at in schedules.due(kind, now):  # type: ignore[arg-type]
        entry.callback(at)
        fired.append(entry.callback.__name__)
    return fired


def test_schedules_fire_in_due_order_once_per_advance() -> None:
    schedules = Punctuations()
    calls: list[tuple[str, int]] = []

    def every_100(now: int) -> None:
        calls.append(("100", now))

    def every_30(now: int) -> None:
        calls.append(("30", now))

    schedules.schedule(100, STREAM_TIME, every_100)
    schedules.schedule(30, STREAM_TIME, every_30)
    fire(schedules, STREAM_TIME, 10)  # aligns: due at 100 and 30
    assert fire(schedules, STREAM_TIME, 20) == []
    assert fire(schedules, STREAM_TIME, 35) == ["every_30"]
    assert fire(schedules, STREAM_TIME, 500) == ["every_30", "every_100"]
    assert calls == [("30", 35), ("30", 500), ("100", 500)]


def test_wall_clock_and_stream_time_schedules_are_apart_and_cancel_works() -> None:
    schedules = Punctuations()
    wall = schedules.schedule(10, WALL_CLOCK, lambda now: None)
    schedules.schedule(10, STREAM_TIME, lambda now: None)
    schedules.due(WALL_CLOCK, 0)
    schedules.due(STREAM_TIME, 0)
    assert [entry for entry, _ in schedules.due(WALL_CLOCK, 10)] == [wall]
    wall.cancel()
    assert schedules.due(WALL_CLOCK, 100) == []
    assert len(schedules.due(STREAM_TIME, 100)) == 1


@given(st.lists(st.integers(min_value=0, max_value=5_000), min_size=1))
def test_a_schedule_fires_at_most_once_per_interval_boundary_crossed(times: list[int]) -> None:
    schedules = Punctuations()
    schedules.schedule(100, STREAM_TIME, lambda now: None)
    fired_at = []
    stream_time = -1
    for time in times:
        stream_time = max(stream_time, time)
        fired_at.extend(at for _, at in schedules.due(STREAM_TIME, stream_time))
    assert fired_at == sorted(fired_at)
    buckets = [at // 100 for at in fired_at]
    assert len(buckets) == len(set(buckets))
