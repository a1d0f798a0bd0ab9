"""Where an admin reset moves each partition's stable offset, for every way of naming the
target (docs/api.md, "Resetting offsets"). One rule for the API, its dry run and the CLI.

The modes are kafka-consumer-groups' ``--reset-offsets`` ones, with Kafka's meanings: the
earliest offset is the log start, the latest the high watermark, a time picks the first
record at or after it (the log end when there is none), and a shift moves from the stored
offset and stays within the log. An explicit offset is not clamped: past the log end it is
refused unless forced (``coordinator.core.log_end``), since a typo there should not turn
into "the log end" silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from client.protocol.committed import CommittedOffsets
from coordinator.core.offsets import reset_offsets
from coordinator.errors import InvalidRequest, UnknownTopicOrPartition


class ResetMode(StrEnum):
    DROP_RANGES = "drop_ranges"
    TO_OFFSET = "to_offset"
    TO_EARLIEST = "to_earliest"
    TO_LATEST = "to_latest"
    TO_DATETIME = "to_datetime"
    SHIFT_BY = "shift_by"


# The modes whose target comes from the log, so the cluster must be asked.
NEEDS_LOG_START = frozenset({ResetMode.TO_EARLIEST, ResetMode.SHIFT_BY})
NEEDS_LOG_END = frozenset({ResetMode.TO_LATEST, ResetMode.TO_DATETIME, ResetMode.SHIFT_BY})


@dataclass(frozen=True)
class ResetTarget:
    """The request's target: ``value`` is the offset of TO_OFFSET, the shift of SHIFT_BY and
    the time (epoch milliseconds) of TO_DATETIME."""

    mode: ResetMode
    value: int | None = None

    @property
    def moves_offset(self) -> bool:
        return self.mode is not ResetMode.DROP_RANGES


@dataclass(frozen=True)
class LogFacts:
    """What the cluster said about one partition; None where it was not asked or not known.
    ``at_time`` is None also when no record is at or after the requested time."""

    log_start: int | None = None
    log_end: int | None = None
    at_time: int | None = None


def target_from_request(
    to_offset: int | None,
    to_earliest: bool,
    to_latest: bool,
    to_datetime_ms: int | None,
    shift_by: int | None,
) -> ResetTarget:
    """The one mode the request names; naming two is refused (Kafka's tool does the same)."""
    given = [
        target
        for present, target in (
            (to_offset is not None, ResetTarget(ResetMode.TO_OFFSET, to_offset)),
            (to_earliest, ResetTarget(ResetMode.TO_EARLIEST)),
            (to_latest, ResetTarget(ResetMode.TO_LATEST)),
            (to_datetime_ms is not None, ResetTarget(ResetMode.TO_DATETIME, to_datetime_ms)),
            (shift_by is not None, ResetTarget(ResetMode.SHIFT_BY, shift_by)),
        )
        if present
    ]
    if len(given) > 1:
        names = ", ".join(str(target.mode) for target in given)
        raise InvalidRequest(f"name one reset target, not several ({names})")
    return given[0] if given else ResetTarget(ResetMode.DROP_RANGES)


def new_state(
    target: ResetTarget,
    where: str,
    current: CommittedOffsets | None,
    facts: LogFacts,
) -> CommittedOffsets:
    """The partition's state after the reset. ``current`` is None when the group has no
    offset stored for it; ``where`` names the partition in refusals."""
    offset = (
        None if target.mode is ResetMode.DROP_RANGES else _new_offset(target, where, current, facts)
    )
    # Nothing stored reads as offset 0 with nothing above it, as a first commit finds it.
    return reset_offsets(current or CommittedOffsets(stable_offset=0), offset)


def _new_offset(
    target: ResetTarget, where: str, current: CommittedOffsets | None, facts: LogFacts
) -> int:
    mode, value = target.mode, target.value
    if mode is ResetMode.TO_OFFSET and value is not None:
        return value
    if mode is ResetMode.TO_EARLIEST:
        return _known(facts.log_start, where, "log start")
    if mode is ResetMode.TO_LATEST:
        return _known(facts.log_end, where, "log end")
    if mode is ResetMode.TO_DATETIME:
        if facts.at_time is not None:
            return facts.at_time
        return _known(facts.log_end, where, "log end")
    if mode is ResetMode.SHIFT_BY and value is not None:
        if current is None:
            raise InvalidRequest(
                f"cannot shift the offset of {where}: the group has no offset stored for it"
            )
        start = _known(facts.log_start, where, "log start")
        end = _known(facts.log_end, where, "log end")
        return min(max(current.stable_offset + value, start), end)
    raise ValueError(f"reset target {target} names no offset")


def _known(value: int | None, where: str, what: str) -> int:
    if value is None:
        raise UnknownTopicOrPartition(
            f"the Kafka cluster has no {what} for {where}: the partition does not exist or "
            "has no leader now"
        )
    return value
