"""The ``keyrange`` PySpark data source: batch and streaming reads of key-range slices.

Planning runs on the driver (in Spark's planner worker): it resolves where each partition
starts and ends, fetches what the group has already processed, and cuts the partitions into
slices, one Spark task each. Executors only read Kafka; they never call the coordinator.
Processed work is reported after Spark finished a batch — by the stream reader itself once
Spark has written the batch to its commit log (``KeyrangeStreamReader``), or by
``BatchRead.commit`` for batch jobs — never from the tasks, whose batch may still fail.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
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

from client.http import PartitionCommitReply
from client.spark.bounds import fetch_committed, resolve_spans, resolve_starts, starting_positions
from client.spark.commit import CommitFailed, commit_positions
from client.spark.kafka import ClusterView
from client.spark.log_reset import reset_stream_past_end
from client.spark.options import (
    PLANNED_BATCH_OPTION,
    OptionError,
    SourceOptions,
    includes_headers,
    offsets_to_json,
    parse_sink_options,
    parse_source_options,
    slices_for,
)
from client.spark.planning import (
    PartitionSpan,
    Position,
    Slice,
    advance,
    group_of,
    plan_slices,
    positions_of,
    spans_between,
    stream_offset,
)
from client.spark.reader import read_batches, schema
from client.spark.sink import KafkaBatchWriter, KafkaStreamWriter

logger = logging.getLogger(__name__)

SHORT_NAME = "keyrange"
_BOUNDS = frozenset(
    {
        "starting_offsets",
        "ending_offsets",
        "startingoffsets",
        "endingoffsets",
        "startingtimestamp",
        "endingtimestamp",
        "startingoffsetsbytimestamp",
        "endingoffsetsbytimestamp",
    }
)


class KeyrangeDataSource(DataSource):
    """``spark.read.format("keyrange")`` / ``readStream`` / ``write`` / ``writeStream``."""

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def schema(self) -> StructType:
        return schema(includes_headers(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        return KeyrangeBatchReader(parse_source_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = parse_source_options(self.options)
        if options.batch_only:
            raise OptionError(
                f"option {options.batch_only[0]!r} bounds batch queries only; a stream reads "
                "on (as with Spark's Kafka source)"
            )
        return KeyrangeStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return KafkaBatchWriter(parse_sink_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return KafkaStreamWriter(parse_sink_options(self.options), schema)


class KeyrangeBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions) -> None:
        self._options = options

    def partitions(self) -> list[InputPartition]:
        options = self._options
        if options.group is not None and not options.planned_batch:
            logger.warning(
                f"a batch read reports nothing to group {options.group!r} by itself: plan it "
                "with client.spark.plan_batch_read(...) and call its commit() once the output "
                "is written (docs/spark.md, Quick start)",
                extra={"group": options.group},
            )
        spans = asyncio.run(resolve_spans(options))
        return asyncio.run(plan_partitions(options, spans))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self._options, partition)


class KeyrangeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of every partition of the subscription, from the previous batch end on.

    Finished batches are reported by the reader itself (docs/spark.md, "Committing"): Spark
    calls ``latestOffset(start)`` only once every batch ending at ``start`` is in the
    checkpoint's commit log, including after the last batch of an ``availableNow`` run,
    which ``commit(end)`` never hears of. ``commit(end)``, the documented hook, reports an
    offset ``latestOffset`` has not seen; Spark always shows it there first.
    """

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._available_now_target: dict[TopicPartition, int] | None = None
        self._offered: str | None = None
        self._reported: str | None = None
        self._last_batch_at: float | None = None

    def initialOffset(self) -> dict[str, Any]:
        starts = asyncio.run(starting_positions(self._options, self._options.starting))
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
        self._report_finished(start, ends)
        # A partition created after the query started: read it from the group's position
        # or its beginning, as Spark's Kafka source does for new partitions.
        positions.update(new_starts)
        positions = asyncio.run(self._restart_past_end(positions, ends))
        if self._available_now_target is not None:
            target = self._available_now_target
            ends = {tp: min(end, target.get(tp, positions[tp].next)) for tp, end in ends.items()}
        elif not self._enough_waiting(positions, ends):
            return stream_offset(self._options.group, positions)
        max_records = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = advance(positions, ends, max_records)
        if end != positions:
            self._last_batch_at = time.monotonic()
        return stream_offset(self._options.group, end)

    def commit(self, end: dict[str, Any]) -> None:
        if json.dumps(end, sort_keys=True) != self._offered:
            self._report_finished(end, {})

    def _enough_waiting(
        self, positions: Mapping[TopicPartition, Position], ends: Mapping[TopicPartition, int]
    ) -> bool:
        """``minOffsetsPerTrigger``: run a batch once that many records wait, or once
        ``maxTriggerDelay`` has passed since the last batch (since the query start at first)."""
        minimum = self._options.min_records_per_trigger
        if minimum is None:
            return True
        now = time.monotonic()
        if self._last_batch_at is None:
            self._last_batch_at = now
        waiting = sum(max(0, ends.get(tp, p.next) - p.next) for tp, p in positions.items())
        return waiting >= minimum or now - self._last_batch_at >= self._options.max_trigger_delay_s

    def _report_finished(self, offset: dict[str, Any], ends: Mapping[TopicPartition, int]) -> None:
        """Report every batch up to ``offset``, which Spark has committed.

        A position past its partition's log end in ``ends`` is not reported: the batch
        finished in a log that is gone (a broker that lost its data), and the records it
        names do not exist. A failed report is logged and made again at the next trigger
        (each report repeats everything since the origin); in an ``availableNow`` run it
        fails the query instead, since no later trigger would make it.
        """
        options = self._options
        group = group_of(offset)
        key = json.dumps(offset, sort_keys=True)
        self._offered = key
        if options.coordinator_url is None or group is None or key == self._reported:
            return
        positions = {
            tp: p
            for tp, p in positions_of(offset).items()
            if p.next > p.origin and p.next <= ends.get(tp, p.next)
        }
        if positions:
            try:
                asyncio.run(
                    commit_positions(
                        options.coordinator_url, options.coordinator_token, group, positions
                    )
                )
            except Exception as error:
                if self._available_now_target is not None:
                    raise CommitFailed(
                        f"could not report the finished batches of group {group}: {error}"
                    ) from error
                logger.warning(
                    "could not report finished batches; the next trigger reports them again",
                    exc_info=True,
                    extra={"group": group},
                )
                return
        self._reported = key

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
            partitions = await view.partitions(options.subscription)
            unknown = [tp for tp in partitions if tp not in positions]
            new_starts = await resolve_starts(options, view, unknown, "committed")
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


def _read(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    piece = partition.value
    if not isinstance(piece, Slice):
        # Spark substitutes one empty partition when planning found nothing to read.
        return iter(())
    return read_batches(piece, options)


async def plan_partitions(
    options: SourceOptions, spans: Sequence[PartitionSpan]
) -> list[InputPartition]:
    committed = (
        await fetch_committed(options, sorted({span.topic for span in spans}))
        if options.skip_processed
        else {}
    )
    total = sum(span.end - span.start for span in spans)
    counts = {
        span.topic_partition: slices_for(span.end - span.start, total, options) for span in spans
    }
    slices = plan_slices(spans, counts, options.slice_by, committed)
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
    # The pinned offsets replace whatever chose them (an alias, a timestamp form).
    replaced = _BOUNDS | {"skip_processed", PLANNED_BATCH_OPTION}
    pinned = {key: value for key, value in options.items() if key.lower() not in replaced}
    pinned["startingOffsets"] = offsets_to_json({s.topic_partition: s.start for s in spans})
    pinned["endingOffsets"] = offsets_to_json({s.topic_partition: s.end for s in spans})
    # The pinned JSON start is explicit; whether the group's progress applies stays as the
    # options the read was planned from said.
    pinned["skip_processed"] = "true" if source.skip_processed else "false"
    pinned[PLANNED_BATCH_OPTION] = "true"
    return BatchRead(options=pinned, spans=spans, source=source)
