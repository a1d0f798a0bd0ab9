"""Where a read starts and ends: Spark's ``startingOffsets``, ``endingOffsets`` and their
by-timestamp forms resolved against the log and the group's committed state (driver side).

Spark's sentinels keep their meaning per partition (-2 the log start, -1 the log end), and
``latest`` is the high watermark carried by a fetch response, never a ListOffsets answer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from client.errors import OffsetOutOfRange
from client.http import CoordinatorClient
from client.protocol.committed import CommittedOffsets
from client.spark.kafka import ClusterView, UnsupportedLookup
from client.spark.log_reset import reset_committed_past_end, start_by_policy
from client.spark.options import EARLIEST, LATEST, ByTimestamp, OptionError, SourceOptions, Starting
from client.spark.planning import PartitionSpan, Position

logger = logging.getLogger(__name__)


async def fetch_committed(
    options: SourceOptions, topics: Sequence[str]
) -> dict[TopicPartition, CommittedOffsets]:
    if options.coordinator_url is None or options.group is None:
        return {}
    async with CoordinatorClient(options.coordinator_url, token=options.coordinator_token) as api:
        return await api.fetch_offsets(options.group, topics=list(topics))


async def resolve_spans(options: SourceOptions) -> list[PartitionSpan]:
    """Batch read: each partition from its starting position to its ending position."""
    async with ClusterView(options.bootstrap, options.kafka) as view:
        partitions = await view.partitions(options.subscription)
        starts = await resolve_starts(options, view, partitions, options.starting)
        latest = await view.latest({tp: start.origin for tp, start in starts.items()})
        ends = await _ending_offsets(options, view, latest)
    return [
        PartitionSpan(
            tp.topic,
            tp.partition,
            starts[tp].origin,
            starts[tp].origin,
            max(starts[tp].origin, ends[tp]),
            starts[tp].explicit,
        )
        for tp in partitions
    ]


async def starting_positions(
    options: SourceOptions, starting: Starting
) -> dict[TopicPartition, Position]:
    async with ClusterView(options.bootstrap, options.kafka) as view:
        partitions = await view.partitions(options.subscription)
        return await resolve_starts(options, view, partitions, starting)


async def resolve_starts(
    options: SourceOptions,
    view: ClusterView,
    partitions: Sequence[TopicPartition],
    starting: Starting,
) -> dict[TopicPartition, Position]:
    """Where reading begins; never below the log start (those records are gone).

    An origin that ``startingOffsets`` put above the log start is marked explicit: the
    group's position rules did not skip the records below it, this query did.
    """
    if not partitions:
        return {}
    earliest = await view.earliest(partitions)
    if starting == "committed":
        committed = await reset_committed_past_end(
            options,
            view,
            await fetch_committed(options, sorted({tp.topic for tp in partitions})),
            earliest,
        )
        stored = {tp: committed[tp].stable_offset for tp in partitions if tp in committed}
        starts = await start_by_policy(options, view, stored, partitions, earliest)
        return {tp: Position(offset, offset) for tp, offset in starts.items()}
    if starting == "earliest":
        requested = {tp: EARLIEST for tp in partitions}
    elif starting == "latest":
        requested = {tp: LATEST for tp in partitions}
    elif isinstance(starting, ByTimestamp):
        requested = await _starts_by_timestamp(view, starting, partitions)
    else:
        requested = {tp: starting.get(tp, EARLIEST) for tp in partitions}
    wanted = await _resolve_sentinels(view, requested, earliest)
    for tp, offset in wanted.items():
        if offset < earliest[tp]:
            message = (
                f"starting offset {offset} of {tp.topic}[{tp.partition}] is below its log "
                f"start {earliest[tp]} (records deleted)"
            )
            if options.fail_on_data_loss:
                raise OffsetOutOfRange(f"{message}, and failOnDataLoss is true")
            logger.warning(
                "%s; starting at the log start",
                message,
                extra={"topic": tp.topic, "partition": tp.partition, "wanted": offset},
            )
    origins = {tp: max(offset, earliest[tp]) for tp, offset in wanted.items()}
    return {
        tp: Position(origin, origin, explicit=origin > earliest[tp])
        for tp, origin in origins.items()
    }


async def _resolve_sentinels(
    view: ClusterView,
    requested: Mapping[TopicPartition, int],
    earliest: Mapping[TopicPartition, int],
) -> dict[TopicPartition, int]:
    at_end = [tp for tp, offset in requested.items() if offset == LATEST]
    latest = await view.latest({tp: earliest[tp] for tp in at_end})
    return {
        tp: earliest[tp] if offset == EARLIEST else latest.get(tp, offset)
        for tp, offset in requested.items()
    }


async def _starts_by_timestamp(
    view: ClusterView, spec: ByTimestamp, partitions: Sequence[TopicPartition]
) -> dict[TopicPartition, int]:
    found = await _by_timestamp(view, spec, partitions)
    starts: dict[TopicPartition, int] = {}
    for tp in partitions:
        if tp not in found:
            starts[tp] = EARLIEST
            continue
        offset = found[tp]
        if offset is None and spec.when_missing == "error":
            raise OptionError(
                f"no record of {tp.topic}[{tp.partition}] has a timestamp at or after the "
                "starting timestamp; set startingOffsetsByTimestampStrategy=latest to start "
                "at the log end there"
            )
        starts[tp] = LATEST if offset is None else offset
    return starts


async def _ending_offsets(
    options: SourceOptions, view: ClusterView, latest: Mapping[TopicPartition, int]
) -> dict[TopicPartition, int]:
    ending = options.ending
    if ending == "latest":
        return dict(latest)
    if isinstance(ending, ByTimestamp):
        found = await _by_timestamp(view, ending, list(latest))
        requested = {tp: LATEST if offset is None else offset for tp, offset in found.items()}
    else:
        requested = ending
    ends = {}
    for tp, end in latest.items():
        wanted = requested.get(tp, LATEST)
        if wanted > end:
            logger.warning(
                "ending offset is beyond the log end; reading to the log end",
                extra={"topic": tp.topic, "partition": tp.partition, "requested": wanted},
            )
        ends[tp] = end if wanted == LATEST else min(end, wanted)
    return ends


async def _by_timestamp(
    view: ClusterView, spec: ByTimestamp, partitions: Sequence[TopicPartition]
) -> dict[TopicPartition, int | None]:
    if spec.every is not None:
        timestamps = {tp: spec.every for tp in partitions}
    else:
        timestamps = {tp: ts for tp, ts in spec.partitions.items() if tp in set(partitions)}
    try:
        return await view.offsets_for_times(timestamps)
    except UnsupportedLookup as error:
        raise OptionError(f"offsets by timestamp: {error}") from None
    except KafkaError as error:
        raise OptionError(
            "offsets by timestamp need a broker that answers ListOffsets by timestamp; "
            f"this one did not ({type(error).__name__}: {error})"
        ) from error
