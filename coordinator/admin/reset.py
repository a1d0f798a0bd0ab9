"""An admin offset reset of an empty group: which partitions, where each goes (the rule is
``coordinator.core.reset_plan``), what the log says about them, and writing it, unless the
caller asked for the plan only (``dry_run``, the CLI's default as in kafka-consumer-groups)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fastapi import Request
from sqlalchemy.ext.asyncio import AsyncConnection

from client.protocol.committed import CommittedOffsets
from coordinator.admin.lag import admin_offsets
from coordinator.admin.schemas import ResetPartition, ResetReply, ResetRequest
from coordinator.core.log_end import reset_refusal
from coordinator.core.reset_plan import (
    NEEDS_LOG_END,
    NEEDS_LOG_START,
    LogFacts,
    ResetMode,
    ResetTarget,
    new_state,
    target_from_request,
)
from coordinator.db.engine import driver_connection
from coordinator.errors import InvalidRequest, ServiceUnavailable
from coordinator.kafka import ClusterMetadata, KafkaClusterError
from coordinator.offsets import repository as offsets_repository
from coordinator.offsets.repository import StoredPartition

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]


async def reset_group(
    request: Request, connection: AsyncConnection, group_id: str, body: ResetRequest
) -> ResetReply:
    """Plan the reset and, unless ``dry_run``, store it; the caller has locked the group and
    checked that it is empty."""
    to_datetime_ms = None if body.to_datetime is None else int(body.to_datetime.timestamp() * 1000)
    target = target_from_request(
        body.to_offset, body.to_earliest, body.to_latest, to_datetime_ms, body.shift_by
    )
    current = await _current_states(connection, group_id, body, target)
    keys = sorted(current)
    facts = await _log_facts(request, body, target, [partition for _, partition in keys])
    planned = {
        key: new_state(target, f"{key[0]}[{key[1]}]", current[key], facts.get(key[1], LogFacts()))
        for key in keys
    }
    if not body.dry_run:
        await _store(connection, group_id, current, planned)
        log.info(
            "offsets reset",
            extra={
                "group_id": group_id,
                "topic": body.topic,
                "mode": str(target.mode),
                "partitions": len(keys),
            },
        )
    shown = await admin_offsets(
        request,
        [
            StoredPartition(topic, partition, planned[(topic, partition)])
            for topic, partition in keys
        ],
    )
    return ResetReply(
        group_id=group_id,
        dry_run=body.dry_run,
        partitions=[
            ResetPartition(
                **entry.model_dump(),
                previous_offset=_stable_offset(current[(entry.topic, entry.partition)]),
            )
            for entry in shown
        ],
    )


def _stable_offset(state: CommittedOffsets | None) -> int | None:
    return None if state is None else state.stable_offset


async def _current_states(
    connection: AsyncConnection, group_id: str, body: ResetRequest, target: ResetTarget
) -> dict[TopicPartition, CommittedOffsets | None]:
    """The partitions the reset covers with their stored state (None: nothing stored yet),
    their rows locked. Named partitions are all covered when the reset sets an offset; without
    names, the partitions the group has offsets for in the topic are."""
    stored = await offsets_repository.lock_existing_partitions(
        connection, group_id, body.topic, body.partitions
    )
    if not target.moves_offset:
        return dict(stored)
    if body.partitions is None:
        if not stored:
            raise InvalidRequest(
                f"group '{group_id}' has no offsets for topic '{body.topic}'; name the "
                "partitions to reset explicitly"
            )
        return dict(stored)
    return {
        (body.topic, partition): stored.get((body.topic, partition))
        for partition in body.partitions
    }


async def _log_facts(
    request: Request, body: ResetRequest, target: ResetTarget, partitions: Sequence[int]
) -> dict[int, LogFacts]:
    """What the cluster says about the partitions, asked only for what the mode needs. An
    unforced explicit offset is checked against the log ends here."""
    checks_offset = target.mode is ResetMode.TO_OFFSET and not body.force
    reads_log = target.mode in NEEDS_LOG_START | NEEDS_LOG_END
    if not (checks_offset or reads_log) or not partitions:
        return {}
    cluster: ClusterMetadata | None = getattr(request.app.state, "cluster", None)
    if cluster is None:
        if reads_log:
            raise InvalidRequest(
                f"{target.mode} needs the Kafka cluster's offsets and this coordinator has no "
                "cluster configured (KEYRANGE_KAFKA_BOOTSTRAP); reset to an offset instead"
            )
        # Run without a cluster (offset storage only): nothing to check an offset against.
        return {}
    wanted = [(body.topic, partition) for partition in partitions]
    try:
        counts = await cluster.partition_counts([body.topic])
        present = [tp for tp in wanted if tp[1] < counts.get(body.topic, 0)]
        ends = await cluster.high_watermarks(present)
        starts = await cluster.log_start_offsets(present) if target.mode in NEEDS_LOG_START else {}
        at_time = (
            await cluster.offsets_for_time(present, target.value)
            if target.mode is ResetMode.TO_DATETIME and target.value is not None
            else {}
        )
    except KafkaClusterError as exc:
        raise ServiceUnavailable(
            f"cannot read the log offsets of '{body.topic}' for the reset ({exc}); retry"
            + (", or pass force to reset anyway" if checks_offset else "")
        ) from None
    if checks_offset:
        assert target.value is not None
        refused = reset_refusal(
            body.topic,
            list(partitions),
            target.value,
            counts.get(body.topic),
            {partition: end for (_, partition), end in ends.items()},
        )
        if refused is not None:
            raise refused
    return {
        partition: LogFacts(
            log_start=starts.get((body.topic, partition)),
            log_end=ends.get((body.topic, partition)),
            at_time=at_time.get((body.topic, partition)),
        )
        for partition in partitions
    }


async def _store(
    connection: AsyncConnection,
    group_id: str,
    current: dict[TopicPartition, CommittedOffsets | None],
    planned: dict[TopicPartition, CommittedOffsets],
) -> None:
    driver = await driver_connection(connection)
    missing = [
        (group_id, topic, partition)
        for (topic, partition), state in current.items()
        if state is None
    ]
    if missing:
        await offsets_repository.create_partitions(driver, missing)
    await offsets_repository.write_partitions(
        driver,
        {(group_id, topic, partition): state for (topic, partition), state in planned.items()},
    )
