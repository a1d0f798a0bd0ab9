"""A group's stored offsets beside the log ends: lag, IC offsets and "past the log end", as
every admin view shows them (the admin API, its reset replies, the web console)."""

from __future__ import annotations

import logging

from fastapi import Request

from client.protocol.log_bounds import past_log_end
from coordinator.admin.schemas import AdminPartitionOffsets
from coordinator.core.offsets import ic_offset_count
from coordinator.offsets.repository import StoredPartition

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
    request: Request, stored: list[StoredPartition]
) -> list[AdminPartitionOffsets]:
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
            lag = max(0, high - item.state.stable_offset)
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
    return result
