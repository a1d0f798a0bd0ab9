"""The desired-members figure KEDA scales workers on (coordinator/core/scaling.py)."""

from __future__ import annotations

import pytest

from client.protocol.committed import CommittedOffsets
from coordinator.core.scaling import (
    ProgressHistory,
    ProgressSample,
    ScalingPolicy,
    desired_members,
    group_progress,
)

POLICY = ScalingPolicy(catch_up_s=60, min_members=1, max_members=50)


def sample(at_s: float, processed: int, lag: int | None = 0, members: int = 2) -> ProgressSample:
    return ProgressSample(at_s=at_s, processed=processed, lag=lag, members=members)


# --- the rate ---------------------------------------------------------------------------------


def test_one_sample_has_no_rate_yet() -> None:
    history = ProgressHistory(window_s=120)
    history.add(sample(0, 100))
    assert history.processing_rate() is None


def test_rate_is_committed_progress_over_time() -> None:
    history = ProgressHistory(window_s=120)
    history.add(sample(0, 1_000))
    history.add(sample(10, 1_500))
    history.add(sample(20, 3_000))
    assert history.processing_rate() == pytest.approx(100.0)


def test_samples_closer_than_the_minimum_span_give_no_rate() -> None:
    history = ProgressHistory(window_s=120)
    history.add(sample(0, 0))
    history.add(sample(0.2, 500))
    assert history.processing_rate() is None


def test_old_samples_leave_the_window_but_the_newest_of_them_stays_as_baseline() -> None:
    history = ProgressHistory(window_s=30)
    for at_s, processed in [(0, 0), (10, 100), (20, 200), (100, 1_000)]:
        history.add(sample(at_s, processed))
    assert [kept.at_s for kept in history.samples] == [20, 100]
    assert history.processing_rate() == pytest.approx(10.0)


def test_progress_that_went_backwards_starts_the_history_again() -> None:
    history = ProgressHistory(window_s=120)
    history.add(sample(0, 5_000))
    history.add(sample(10, 6_000))
    history.add(sample(20, 0))
    assert history.processing_rate() is None
    history.add(sample(30, 400))
    assert history.processing_rate() == pytest.approx(40.0)


# --- the reading -------------------------------------------------------------------------------


def committed(stable: int, *ranges: tuple[int, int]) -> CommittedOffsets:
    return CommittedOffsets(stable_offset=stable, ranges=ranges)


def test_progress_counts_ic_ranges_as_processed_and_not_as_lag() -> None:
    reading = group_progress(
        5.0,
        3,
        {("t", 0): committed(100, (110, 119)), ("t", 1): committed(40)},
        {("t", 0): 150, ("t", 1): 40},
    )
    assert reading == ProgressSample(at_s=5.0, processed=100 + 10 + 40, lag=40, members=3)


def test_a_subscribed_partition_with_nothing_committed_lags_by_its_whole_log() -> None:
    reading = group_progress(
        0.0, 1, {("t", 0): committed(10)}, {("t", 0): 10, ("t", 1): 70}, [("t", 0), ("t", 1)]
    )
    assert (reading.processed, reading.lag) == (10, 70)


def test_an_offset_past_the_log_end_lags_by_the_whole_log() -> None:
    reading = group_progress(0.0, 1, {("t", 0): committed(500)}, {("t", 0): 30})
    assert reading.lag == 30


def test_one_unknown_log_end_makes_the_lag_unknown_not_smaller() -> None:
    reading = group_progress(
        0.0, 1, {("t", 0): committed(0), ("t", 1): committed(0)}, {("t", 0): 1_000}
    )
    assert reading.lag is None


# --- the figure -------------------------------------------------------------------------------


def test_zero_lag_asks_for_the_minimum_whatever_the_rate() -> None:
    figure = desired_members(sample(0, 0, lag=0, members=8), 500.0, POLICY)
    assert (figure.desired_members, figure.reason) == (1, "caught-up")
    to_zero = ScalingPolicy(catch_up_s=60, min_members=0, max_members=50)
    assert desired_members(sample(0, 0, lag=0, members=8), None, to_zero).desired_members == 0


def test_an_unknown_lag_holds_the_current_members_even_at_zero() -> None:
    figure = desired_members(sample(0, 0, lag=None, members=6), 300.0, POLICY)
    assert (figure.desired_members, figure.reason) == (6, "lag-unknown")
    to_zero = ScalingPolicy(catch_up_s=60, min_members=0, max_members=50)
    assert desired_members(sample(0, 0, lag=None, members=0), None, to_zero).desired_members == 0


def test_no_rate_yet_holds_the_current_members() -> None:
    figure = desired_members(sample(0, 0, lag=1_000_000, members=3), None, POLICY)
    assert (figure.desired_members, figure.reason) == (3, "measuring")
    assert figure.processing_rate is None and figure.member_rate is None


def test_a_group_scaled_to_zero_with_lag_asks_for_one_member() -> None:
    to_zero = ScalingPolicy(catch_up_s=60, min_members=0, max_members=50)
    figure = desired_members(sample(0, 0, lag=10, members=0), 25.0, to_zero)
    assert (figure.desired_members, figure.reason) == (1, "measuring")


def test_members_that_commit_nothing_hold_instead_of_scaling_on_a_zero_rate() -> None:
    figure = desired_members(sample(0, 0, lag=5_000, members=4), 0.0, POLICY)
    assert (figure.desired_members, figure.reason) == (4, "stalled")


def test_lag_over_what_a_member_works_off_in_the_catch_up_time() -> None:
    # 2 members at 200 records/s: 100 per member, 6 000 in the 60 s catch-up time.
    figure = desired_members(sample(0, 0, lag=60_000, members=2), 200.0, POLICY)
    assert (figure.desired_members, figure.reason) == (10, "lag")
    assert figure.member_rate == pytest.approx(100.0)
    assert desired_members(sample(0, 0, lag=60_001, members=2), 200.0, POLICY).desired_members == 11


def test_the_figure_follows_the_lag_both_ways() -> None:
    rate = 200.0
    figures = [
        desired_members(sample(0, 0, lag=lag, members=2), rate, POLICY).desired_members
        for lag in (3_000, 30_000, 90_000, 12_000)
    ]
    assert figures == [1, 5, 15, 2]


def test_the_partition_count_is_no_ceiling_only_the_maximum_is() -> None:
    # A one-partition topic far behind: members share the partition by key range.
    figure = desired_members(sample(0, 0, lag=10_000_000, members=1), 100.0, POLICY)
    assert figure.desired_members == POLICY.max_members


def test_the_minimum_holds_when_the_lag_asks_for_less() -> None:
    policy = ScalingPolicy(catch_up_s=60, min_members=3, max_members=50)
    assert desired_members(sample(0, 0, lag=10, members=5), 500.0, policy).desired_members == 3


@pytest.mark.parametrize(
    ("catch_up_s", "min_members", "max_members"), [(0, 1, 5), (-1, 1, 5), (60, 6, 5), (60, -1, 5)]
)
def test_a_policy_that_cannot_hold_is_refused(
    catch_up_s: float, min_members: int, max_members: int
) -> None:
    with pytest.raises(ValueError):
        ScalingPolicy(catch_up_s=catch_up_s, min_members=min_members, max_members=max_members)
