"""The ``keyrange`` PySpark data source: batch and streaming reads of key-range slices.

Planning runs on the driver (in Spark's planner worker): it resolves where each partition
starts and ends, fetches what the group has already processed, and cuts the partitions into
slices, one Spark task each. Executors only read Kafka; they never call the coordinator.
Processed work is reported after Spark finished a batch, by ``KeyrangeCommitter`` (streams)
or ``BatchRead.commit`` (batch jobs) — never from the reader, whose batch may still fail.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from aiokafka.structs import TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from client.http import CoordinatorClient, PartitionCommitReply
from client.protocol.committed import CommittedOffsets
from client.spark.commit import commit_positions
from client.spark.kafka import ClusterView
from client.spark.log_reset import (
    reset_committed_past_end,
    reset_stream_past_end,
    start_by_policy,
)
from client.spark.options import (
    SourceOptions,
    Starting,
    offsets_to_json,
    parse_sink_options,
    parse_source_options,
)
from client.spark.planning import (
    PartitionSpan,
    Position,
    Slice,
    advance,
    plan_slices,
    positions_of,
    spans_between,
    stream_offset,
)
from client.spark.reader import SCHEMA, read_batches
from client.spark.sink import KafkaBatchWriter, KafkaStreamWriter

logger = logging.getLogger(__name__)

SHORT_NAME = "keyrange"


class KeyrangeDataSource(DataSource):
    """``spark.read.format("keyrange")`` / ``readStream`` / ``write`` / ``writeStream``."""

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return KeyrangeBatchReader(parse_source_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KeyrangeStreamReader(parse_source_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return KafkaBatchWriter(parse_sink_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return KafkaStreamWriter(parse_sink_options(self.options), schema)


class KeyrangeBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self._options = options

    def partitions(self) -> list[InputPartition]:
        spans = asyncio.run(resolve_spans(self._options))
        return asyncio.run(plan_partitions(self._options, spans))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self._options, partition)


class KeyrangeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of every partition of the topics, from the previous batch end onwards.

    ``commit(end)`` is not where processed work is reported: Spark calls it only when the
    next batch is planned, so the last batch of a run would never be reported. The
    ``KeyrangeCommitter`` listener reports every finished batch instead.
    """

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._available_now_target: dict[TopicPartition, int] | None = None

    def initialOffset(self) -> dict[str, Any]:
        starts = asyncio.run(_starting_positions(self._options, self._options.starting))
        return stream_offset(self._options.group, starts)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self._options.max_records_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        ends, _ = asyncio.run(self._log_ends({}))
        self._available_now_target = ends

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        positions = positions_of(start)
        ends, new_starts = asyncio.run(self._log_ends(positions))
        # A partition created after the query started: read it from the group's position
        # or its beginning, as Spark's Kafka source does for new partitions.
        positions.update(new_starts)
        positions = asyncio.run(self._restart_past_end(positions, ends))
        if self._available_now_target is not None:
            target = self._available_now_target
            ends = {tp: min(end, target.get(tp, positions[tp].next)) for tp, end in ends.items()}
        max_records = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return stream_offset(self._options.group, advance(positions, ends, max_records))

    async def _restart_past_end(
        self, positions: dict[TopicPartition, Position], ends: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, Position]:
        if not any(
            position.next > ends.get(tp, position.next) for tp, position in positions.items()
        ):
            return positions
        options = self._options
        async with ClusterView(options.bootstrap, options.kafka) as view:
            return await reset_stream_past_end(options, view, positions, ends)

    async def _log_ends(
        self, positions: Mapping[TopicPartition, Position]
    ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, Position]]:
        """Log end of every partition, and the start of each partition not in ``positions``."""
        options = self._options
        async with ClusterView(options.bootstrap, options.kafka) as view:
            partitions = await view.partitions(options.topics)
            unknown = [tp for tp in partitions if tp not in positions]
            new_starts = await _resolve_starts(options, view, unknown, "committed")
            seek = {tp: positions[tp].next for tp in partitions if tp in positions}
            ends = await view.latest(seek | {tp: p.origin for tp, p in new_starts.items()})
        return ends, new_starts

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        spans = spans_between(positions_of(start), positions_of(end))
        if not spans:
            return []
        return asyncio.run(plan_partitions(self._options, spans))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self._options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: see the class docstring."""


def _read(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    piece = partition.value
    if not isinstance(piece, Slice):
        # Spark substitutes one empty partition when planning found nothing to read.
        return iter(())
    return read_batches(piece, options.bootstrap, options.kafka)


async def plan_partitions(
    options: SourceOptions, spans: Sequence[PartitionSpan]
) -> list[InputPartition]:
    committed = await fetch_committed(options, sorted({span.topic for span in spans}))
    slices = plan_slices(spans, options.slices_per_partition, options.slice_by, committed)
    logger.info(
        "planned keyrange slices",
        extra={
            "slices": len(slices),
            "partitions": len(spans),
            "slice_by": options.slice_by,
            "records": sum(span.end - span.start for span in spans),
        },
    )
    return [InputPartition(piece) for piece in slices]


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
        partitions = await view.partitions(options.topics)
        starts = await _resolve_starts(options, view, partitions, options.starting)
        ends = await view.latest({tp: start.origin for tp, start in starts.items()})
    if options.ending != "latest":
        requested = options.ending
        for tp, end in ends.items():
            if tp in requested and requested[tp] > end:
                logger.warning(
                    "ending offset is beyond the log end; reading to the log end",
                    extra={"topic": tp.topic, "partition": tp.partition, "requested": end},
                )
        ends = {tp: min(end, requested.get(tp, end)) for tp, end in ends.items()}
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


async def _starting_positions(
    options: SourceOptions, starting: Starting
) -> dict[TopicPartition, Position]:
    async with ClusterView(options.bootstrap, options.kafka) as view:
        partitions = await view.partitions(options.topics)
        return await _resolve_starts(options, view, partitions, starting)


async def _resolve_starts(
    options: SourceOptions,
    view: ClusterView,
    partitions: Sequence[TopicPartition],
    starting: Starting,
) -> dict[TopicPartition, Position]:
    """Where reading begins; never below the log start (those records are gone).

    An origin that ``starting_offsets`` put above the log start is marked explicit: the
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
        wanted = earliest
    elif starting == "latest":
        wanted = await view.latest(earliest)
    else:
        wanted = {tp: starting.get(tp, earliest[tp]) for tp in partitions}
    for tp, offset in wanted.items():
        if offset < earliest[tp]:
            logger.warning(
                "starting offset was deleted by retention; starting at the log start",
                extra={"topic": tp.topic, "partition": tp.partition, "wanted": offset},
            )
    origins = {tp: max(offset, earliest[tp]) for tp, offset in wanted.items()}
    return {
        tp: Position(origin, origin, explicit=origin > earliest[tp])
        for tp, origin in origins.items()
    }


@dataclass(frozen=True)
class BatchRead:
    """A batch read pinned to fixed offsets, so it can be reported once its output is safe.

    ``load`` may be called more than once (each Spark action re-plans the read); it always
    covers the same offsets. Call ``commit`` after the job's output is durably written.
    """

    options: dict[str, str]
    spans: tuple[PartitionSpan, ...]
    source: SourceOptions = field(repr=False)

    def load(self, spark: SparkSession) -> DataFrame:
        return spark.read.format(SHORT_NAME).options(**self.options).load()

    def commit(self) -> list[PartitionCommitReply]:
        source = self.source
        if source.coordinator_url is None or source.group is None:
            raise ValueError("committing a batch read needs the 'coordinator' and 'group' options")
        positions = {
            span.topic_partition: Position(span.origin, span.end, span.explicit)
            for span in self.spans
        }
        return asyncio.run(
            commit_positions(
                source.coordinator_url, source.coordinator_token, source.group, positions
            )
        )


def plan_batch_read(options: Mapping[str, str]) -> BatchRead:
    """Resolve a batch read's start and end offsets now, on the driver."""
    source = parse_source_options(options)
    spans = tuple(asyncio.run(resolve_spans(source)))
    pinned = {key: value for key, value in options.items()}
    pinned["starting_offsets"] = offsets_to_json({s.topic_partition: s.start for s in spans})
    pinned["ending_offsets"] = offsets_to_json({s.topic_partition: s.end for s in spans})
    return BatchRead(options=pinned, spans=spans, source=source)
