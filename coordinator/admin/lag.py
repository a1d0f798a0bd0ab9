"""A group's stored offsets beside the log ends: lag, IC offsets, "past the log end" and the
age of the oldest unprocessed record, as every admin view shows them (the admin API, its
reset replies, the web console).

Lag counts the records not processed yet: from the stable offset to the log end, less the
offsets committed individually above it (exact, as ``coordinator.core.scaling`` counts
them). Watermark pieces are not subtracted: how many of the records below a piece's
watermark hash into its key range is unknown without reading them, and an estimate by hash
share (``coordinator.core.trend.processed_estimate``, which the console's rate uses) would
make the lag an autoscaler reads a guess. So lag is an upper bound while watermarks are
stored."""

from __future__ import annotations

import logging

from fastapi import Request

from client.protocol.log_bounds import past_log_end
from coordinator.admin.schemas import AdminPartitionOffsets
from coordinator.core.offsets import ic_offset_count
from coordinator.offsets.repository import StoredPartition
from coordinator.record_age import oldest_unprocessed

log = logging.getLogger(__name__)


async def _high_watermarks(
    request: Request, stored: list[StoredPartition]
) -> dict[tuple[str, int], int]:
    """High watermarks when a Kafka cluster is configured and reachable; lag is optional."""
    cluster = getattr(request.app.state, "cluster", None)
    if cluster is None or not stored:
        return {}
    try:
        marks: dict[tuple[str, int], int] = await cluster.high_watermarks(
            [(item.topic, item.partition) for item in stored]
        )
    except Exception as exc:
        log.warning("high watermarks unavailable", extra={"error": type(exc).__name__})
        return {}
    return marks


async def admin_offsets(
    request: Request, stored: list[StoredPartition], *, group_id: str | None = None
) -> list[AdminPartitionOffsets]:
    """``group_id``: also the age of each lagging partition's oldest unprocessed record."""
    marks = await _high_watermarks(request, stored)
    result = []
    for item in stored:
        high = marks.get((item.topic, item.partition))
        past_end = high is not None and past_log_end(item.state, high)
        if high is None:
            lag = None
        elif past_end:
            # Every record of the log is unread by this group: what a reader reset to the log
            # start reads (exact for a log that starts at 0, as after a broker lost its data).
            lag = high
        else:
            lag = max(0, high - item.state.stable_offset - ic_offset_count(item.state))
        result.append(
            AdminPartitionOffsets(
                topic=item.topic,
                partition=item.partition,
                stable_offset=item.state.stable_offset,
                ranges=list(item.state.ranges),
                watermarks=list(item.state.pieces),
                metadata=item.state.metadata,
                ic_offsets=ic_offset_count(item.state),
                high_watermark=high,
                lag=lag,
                offset_out_of_range=past_end,
            )
        )
    if group_id is not None:
        await _with_ages(request, group_id, result)
    return result


async def _with_ages(
    request: Request, group_id: str, partitions: list[AdminPartitionOffsets]
) -> None:
    """Only partitions with lag are asked about: a caught-up one has no unprocessed record,
    and one past the log end has no record at its stable offset."""
    lagging = {
        (group_id, item.topic, item.partition): item.stable_offset
        for item in partitions
        if item.lag and not item.offset_out_of_range
    }
    if not lagging:
        return
    ages = await oldest_unprocessed(request.app).ages(
        getattr(request.app.state, "cluster", None), lagging
    )
    for item in partitions:
        item.oldest_unprocessed_age_seconds = ages.get((group_id, item.topic, item.partition))
