"""A group's lag and throughput over the last minutes (coordinator.core.trend) and their
charts (coordinator.ui.drawing.chart): the figures someone opening the console after a page
looks for first."""

from __future__ import annotations

import pytest

from coordinator.core.trend import (
    HASH_SPACE,
    GroupTrend,
    TrendPoint,
    TrendSample,
    processed_estimate,
)
from coordinator.ui.drawing import chart


def test_the_rate_is_progress_over_time_between_samples_newest_last() -> None:
    trend = GroupTrend()
    for at_s, lag, processed in ((0.0, 100, 0), (10.0, 80, 50), (20.0, 90, 60)):
        trend.add(TrendSample(at_s, lag, processed))
    assert trend.lag() == [TrendPoint(20.0, 100.0), TrendPoint(10.0, 80.0), TrendPoint(0.0, 90.0)]
    assert trend.rate() == [TrendPoint(10.0, 5.0), TrendPoint(0.0, 1.0)]


def test_samples_older_than_the_window_go_and_close_ones_replace_each_other() -> None:
    trend = GroupTrend(window_s=60.0, step_s=5.0)
    for second in range(0, 200):
        trend.add(TrendSample(float(second), 0, second))
    ages = [point.age_s for point in trend.lag()]
    assert max(ages) <= 60.0
    # About one sample per step (less the refresh interval), not one per refresh: an open tab
    # costs a bounded number.
    assert len(ages) <= 60 / (5 - 1) + 2


def test_progress_going_backwards_starts_the_trend_again() -> None:
    trend = GroupTrend()
    trend.add(TrendSample(0.0, 0, 1_000))
    trend.add(TrendSample(10.0, 0, 2_000))
    trend.add(TrendSample(20.0, 0, 10))
    assert trend.rate() == []
    assert len(trend.lag()) == 1


def test_an_unknown_lag_is_left_out_rather_than_drawn_as_zero() -> None:
    trend = GroupTrend()
    trend.add(TrendSample(0.0, None, 0))
    trend.add(TrendSample(10.0, 5, 0))
    assert trend.lag() == [TrendPoint(0.0, 5.0)]


def test_the_chart_puts_now_on_the_right_and_the_peak_at_the_top() -> None:
    drawn = chart([TrendPoint(600.0, 0.0), TrendPoint(300.0, 50.0), TrendPoint(0.0, 25.0)], 600.0)
    assert drawn.points == "0.0,100.0 500.0,0.0 1000.0,50.0"
    assert (drawn.peak, drawn.latest) == (50.0, 25.0)


def test_a_flat_zero_line_lies_on_the_bottom_and_no_points_draw_nothing() -> None:
    assert chart([TrendPoint(10.0, 0.0), TrendPoint(0.0, 0.0)], 600.0).points.endswith(",100.0")
    empty = chart([], 600.0)
    assert (empty.points, empty.latest) == ("", None)
    assert chart([TrendPoint(0.0, 3.0)], 600.0).peak == pytest.approx(3.0)


def test_progress_committed_as_watermarks_counts_by_its_share_of_the_hash_space() -> None:
    """Issue 47 item 7: a hot key held the stable offset at 46 while the other keys were
    processed and committed as watermarks, and the console drew 0.0 records/s."""
    half = HASH_SPACE // 2
    assert processed_estimate(46, 0, []) == 46
    lower_half_to_1046 = [(0, half - 1, 1046)]
    assert processed_estimate(46, 0, lower_half_to_1046) == 46 + 500
    both_halves = [(0, half - 1, 1046), (half, HASH_SPACE - 1, 2046)]
    assert processed_estimate(46, 10, both_halves) == 46 + 10 + 500 + 1000
    # A piece at or below the stable offset adds nothing: those offsets are counted already.
    assert processed_estimate(46, 0, [(0, HASH_SPACE - 1, 40)]) == 46
    trend = GroupTrend()
    trend.add(TrendSample(0.0, None, processed_estimate(46, 0, [])))
    trend.add(TrendSample(10.0, None, processed_estimate(46, 0, lower_half_to_1046)))
    assert [point.value for point in trend.rate()] == [50.0]
