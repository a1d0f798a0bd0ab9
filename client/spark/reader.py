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
from client.spark.planning import Slice

# The columns of Spark's own Kafka source, less timestampType, so pipelines port easily.
SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField(
            "headers",
            ArrayType(
                StructType([StructField("key", StringType()), StructField("value", BinaryType())])
            ),
        ),
    ]
)


def arrow_schema() -> pa.Schema:
    # The schema Spark checks record batches against; built by Spark's own conversion so
    # field types and nullability match exactly.
    return to_arrow_schema(SCHEMA, timezone="UTC")


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


def read_batches(
    piece: Slice, bootstrap: str, settings: dict[str, str]
) -> Iterator[pa.RecordBatch]:
    schema = arrow_schema()
    wanted = KeepRecord(piece)
    for chunk in read_slice(piece, bootstrap, settings):
        records = [record for record in chunk if wanted(record)]
        if records:
            yield to_record_batch(records, schema)


def to_record_batch(
    records: Sequence[ConsumerRecord[bytes, bytes]], schema: pa.Schema
) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array([r.topic for r in records], schema.field("topic").type),
            pa.array([r.partition for r in records], schema.field("partition").type),
            pa.array([r.offset for r in records], schema.field("offset").type),
            # Kafka timestamps are milliseconds; Spark's timestamp type is microseconds.
            pa.array([r.timestamp * 1000 for r in records], schema.field("timestamp").type),
            pa.array([r.key for r in records], schema.field("key").type),
            pa.array([r.value for r in records], schema.field("value").type),
            _headers(records, schema.field("headers").type),
        ],
        schema=schema,
    )


def _headers(records: Sequence[ConsumerRecord[bytes, bytes]], arrow_type: pa.DataType) -> pa.Array:
    if not any(r.headers for r in records):
        # Most topics carry no headers: skip building a dict per header of every record.
        return pa.array([[]] * len(records), arrow_type)
    return pa.array([[{"key": k, "value": v} for k, v in r.headers] for r in records], arrow_type)
