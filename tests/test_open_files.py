"""``keyrange serve`` raises its open-file limit to what its connection limit needs (every
waiting member holds a connection), and says so in its log."""

from __future__ import annotations

import logging
import resource
from collections.abc import Iterator

import pytest

from coordinator.serving import open_files_needed, raise_open_file_limit
from tests.fixtures.coordinator import settings_for_tests


@pytest.fixture
def open_file_limit() -> Iterator[tuple[int, int]]:
    """This process's limit, restored afterwards (only ever lowered within the hard limit)."""
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield limits
    resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def test_a_soft_limit_below_the_connection_limit_is_raised_and_logged(
    open_file_limit: tuple[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_for_tests(max_connections=2_000)
    needed = open_files_needed(settings)
    _, hard = open_file_limit
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"the hard open-file limit ({hard}) is below {needed}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1_024, hard))

    with caplog.at_level(logging.INFO, logger="coordinator.serving"):
        raise_open_file_limit(settings)

    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (needed, hard)
    (record,) = [r for r in caplog.records if r.getMessage() == "raised the open-file limit"]
    assert (record.previous, record.limit, record.needed) == (1_024, needed, needed)


def test_a_soft_limit_high_enough_is_left_alone(
    open_file_limit: tuple[int, int], caplog: pytest.LogCaptureFixture
) -> None:
    settings = settings_for_tests(max_connections=100)
    soft, hard = open_file_limit
    if soft != resource.RLIM_INFINITY and soft < open_files_needed(settings):
        pytest.skip(f"the soft open-file limit ({soft}) is below what the test needs")

    with caplog.at_level(logging.INFO, logger="coordinator.serving"):
        raise_open_file_limit(settings)

    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (soft, hard)
    assert not caplog.records
