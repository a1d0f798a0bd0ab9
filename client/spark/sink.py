"""The ``keyrange`` sink: write rows (key, value, headers) to a Kafka topic.

At least once, like Spark's Kafka sink: a task that fails after producing some rows is
retried and produces them again. Each task waits for its records to be acknowledged before
it reports success, so a batch Spark considers written is in Kafka.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from aiokafka import AIOKafkaProducer
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from client.spark.options import OptionError, SinkOptions

SINK_COLUMNS = frozenset({"key", "value", "headers"})


@dataclass(frozen=True)
class Written(WriterCommitMessage):
    records: int


def check_sink_schema(schema: StructType) -> None:
    names = set(schema.fieldNames())
    if "value" not in names or not names <= SINK_COLUMNS:
        raise OptionError(
            f"the keyrange sink writes columns value and optionally key and headers; "
            f"got {sorted(names)} (select or rename the columns first)"
        )


def produce(options: SinkOptions, batches: Iterator[pa.RecordBatch]) -> Written:
    return asyncio.run(_produce(options, batches))


async def _produce(options: SinkOptions, batches: Iterator[pa.RecordBatch]) -> Written:
    arguments: dict[str, Any] = {"bootstrap_servers": options.bootstrap, "acks": "all"}
    arguments.update(options.kafka.client_arguments())
    producer = AIOKafkaProducer(**arguments)
    await producer.start()
    written = 0
    try:
        for batch in batches:
            columns = batch.to_pydict()
            values = columns["value"]
            keys = columns.get("key") or [None] * len(values)
            headers = columns.get("headers") or [None] * len(values)
            pending = [
                await producer.send(
                    options.topic,
                    value=_bytes(value),
                    key=_bytes(key),
                    headers=_headers(header_list),
                )
                for key, value, header_list in zip(keys, values, headers, strict=True)
            ]
            await asyncio.gather(*pending)
            written += len(pending)
    finally:
        await producer.stop()
    return Written(written)


def _bytes(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


def _headers(pairs: Sequence[dict[str, Any]] | None) -> list[tuple[str, bytes]] | None:
    if not pairs:
        return None
    return [(str(pair["key"]), _bytes(pair["value"]) or b"") for pair in pairs]


class KafkaBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        check_sink_schema(schema)
        self._options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        return produce(self._options, iterator)


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        check_sink_schema(schema)
        self._options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        return produce(self._options, iterator)
