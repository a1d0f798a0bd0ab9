"""Executor side of the source: read one slice, keep its records, emit Arrow batches.

Arrow record batches go to the JVM without Spark converting row by row in Python, which
matters when a slice holds millions of records.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from aiokafka.structs import ConsumerRecord
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from client.protocol.committed import CommittedOffsets
from client.protocol.keyspace import KeyRange, key_hash
from client.spark.kafka import read_slice
from client.spark.options import SourceOptions
from client.spark.planning import Slice

HEADERS = StructField(
    "headers",
    ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
)
# The columns of Spark's own Kafka source, in its order, so a pipeline's column expressions
# port unchanged; ``headers`` only with ``includeHeaders=true``, as there.
SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)


def schema(include_headers: bool) -> StructType:
    return StructType([*SCHEMA.fields, HEADERS]) if include_headers else SCHEMA


def arrow_schema(include_headers: bool) -> pa.Schema:
    # The schema Spark checks record batches against; built by Spark's own conversion so
    # field types and nullability match exactly.
    return to_arrow_schema(schema(include_headers), timezone="UTC")


class KeepRecord:
    """Whether a record belongs to the slice and is not already processed by the group."""

    def __init__(self, piece: Slice) -> None:
        self._keys = piece.keys
        self._committed = (
            None if piece.committed is None else CommittedOffsets.from_json(piece.committed)
        )
        # Hashing costs more than the rest of the check; skip it when nothing depends on it.
        self._needs_hash = self._keys != KeyRange.full() or bool(
            self._committed is not None and self._committed.watermarks
        )

    def __call__(self, record: ConsumerRecord[bytes, bytes]) -> bool:
        hash_value = key_hash(record.key, record.offset) if self._needs_hash else 0
        if not self._keys.contains(hash_value):
            return False
        return self._committed is None or not self._committed.is_processed(
            record.offset, hash_value
        )


def read_batches(piece: Slice, options: SourceOptions) -> Iterator[pa.RecordBatch]:
    arrow = arrow_schema(options.include_headers)
    wanted = KeepRecord(piece)
    chunks = read_slice(piece, options.bootstrap, options.kafka, options.poll_timeout_s)
    for chunk in chunks:
        records = [record for record in chunk if wanted(record)]
        if records:
            yield to_record_batch(records, arrow)


def to_record_batch(
    records: Sequence[ConsumerRecord[bytes, bytes]], schema: pa.Schema
) -> pa.RecordBatch:
    columns = [
        pa.array([r.key for r in records], schema.field("key").type),
        pa.array([r.value for r in records], schema.field("value").type),
        pa.array([r.topic for r in records], schema.field("topic").type),
        pa.array([r.partition for r in records], schema.field("partition").type),
        pa.array([r.offset for r in records], schema.field("offset").type),
        # Kafka timestamps are milliseconds; Spark's timestamp type is microseconds.
        pa.array([r.timestamp * 1000 for r in records], schema.field("timestamp").type),
        pa.array([r.timestamp_type for r in records], schema.field("timestampType").type),
    ]
    if schema.get_field_index("headers") >= 0:
        columns.append(_headers(records, schema.field("headers").type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _headers(records: Sequence[ConsumerRecord[bytes, bytes]], arrow_type: pa.DataType) -> pa.Array:
    if not any(r.headers for r in records):
        # Most topics carry no headers: skip building a dict per header of every record.
        return pa.array([[]] * len(records), arrow_type)
    return pa.array([[{"key": k, "value": v} for k, v in r.headers] for r in records], arrow_type)
