"""Per-key totals of a keyed workload with Spark, written to an output topic.

    python -m examples.spark_pipeline

With no arguments it starts an embedded Postgres, an embedded broker and a coordinator
(examples/demo_stack.py), produces a keyed workload (purchases: key = user, value = amount),
and runs a Spark job on ``local[*]``. Point it at running services with ``--bootstrap`` and
``--coordinator``; see docs/spark.md for a real cluster.

The job is a stream run with ``trigger(availableNow=True)``: it processes what is in the
topic now and stops, and each later run picks up where the last one finished (Spark's
checkpoint, and the group's committed offsets at the coordinator). Each partition is cut
into ``--slices`` key-range slices (``slice_by=keys``), so every user's purchases land in one
Spark task in offset order: the per-user totals of a micro-batch are computed inside the
task, with no shuffle. Each micro-batch writes one record per user to the output topic,
``{"user", "purchases", "amount", "batch"}``, and the ``KeyrangeCommitter`` reports the
batch to the coordinator once Spark has finished it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from client.http import CoordinatorClient

USERS = 200


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default: embedded)")
    parser.add_argument("--coordinator", help="coordinator URL (default: embedded)")
    parser.add_argument("--group", default="spark-example")
    parser.add_argument("--input", default="purchases")
    parser.add_argument("--output", default="purchase-totals")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--records", type=int, default=20_000, help="records to produce first")
    parser.add_argument("--slices", type=int, default=4, help="key-range slices per partition")
    parser.add_argument("--max-records-per-trigger", type=int, default=10_000)
    parser.add_argument("--checkpoint", help="Spark checkpoint dir (default: a temp dir)")
    parser.add_argument(
        "--master", help="Spark master (default: spark-submit's, or local[*] under python)"
    )
    parser.add_argument(
        "--driver-host",
        help="address the Spark driver binds to and advertises (default: 127.0.0.1 for a "
        "local run under python, Spark's own choice under spark-submit or another master)",
    )
    return parser.parse_args(argv)


def spark_settings(args: argparse.Namespace) -> dict[str, str]:
    """The session's settings. A local run binds the driver to loopback, so a laptop on a
    shared network (or a host whose name resolves to an unreachable address) runs the
    example without opening ports to the network; executors elsewhere must reach the driver,
    so a cluster master or spark-submit (which hands Python its gateway) keeps Spark's
    choice unless ``--driver-host`` says otherwise."""
    settings = {"spark.ui.showConsoleProgress": "false", "spark.sql.shuffle.partitions": "4"}
    local_run = "PYSPARK_GATEWAY_PORT" not in os.environ and (
        args.master is None or args.master.startswith("local")
    )
    host = args.driver_host or ("127.0.0.1" if local_run else None)
    if host is not None:
        settings["spark.driver.host"] = host
        settings["spark.driver.bindAddress"] = host
    return settings


def main() -> None:
    args = parse_args()
    with ExitStack() as resources:
        bootstrap, coordinator_url = args.bootstrap, args.coordinator
        if bootstrap is None or coordinator_url is None:
            from examples.demo_stack import Stack

            data_dir = Path(resources.enter_context(tempfile.TemporaryDirectory()))
            print("starting an embedded Postgres, broker and coordinator ...", flush=True)
            stack = resources.enter_context(
                Stack(data_dir, database="spark_example", port=_free_port())
            )
            bootstrap = bootstrap or stack.bootstrap
            coordinator_url = coordinator_url or stack.coordinator_url
        checkpoint = args.checkpoint or resources.enter_context(tempfile.TemporaryDirectory())
        asyncio.run(produce_workload(bootstrap, args.input, args.output, args))
        run_pipeline(bootstrap, coordinator_url, checkpoint, args)
        asyncio.run(show_committed(coordinator_url, args.group, args.input))


async def produce_workload(
    bootstrap: str, topic: str, output: str, args: argparse.Namespace
) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        for name, partitions in ((topic, args.partitions), (output, 1)):
            with suppress(TopicAlreadyExistsError):
                await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=10)
    await producer.start()
    try:
        pending = [
            await producer.send(
                topic,
                key=f"user-{index % USERS}".encode(),
                value=str(1 + index % 97).encode(),
            )
            for index in range(args.records)
        ]
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    print(f"produced {args.records} purchases of {USERS} users to {topic!r}", flush=True)


def totals_per_user(rows: Iterable[Any]) -> Iterator[tuple[bytes, bytes]]:
    """Runs inside one Spark task: with slice_by=keys it sees every record of its users."""
    purchases: dict[bytes, int] = {}
    amounts: dict[bytes, int] = {}
    for row in rows:
        user = bytes(row.key)
        purchases[user] = purchases.get(user, 0) + 1
        amounts[user] = amounts.get(user, 0) + int(row.value)
    for user, count in purchases.items():
        total = {"user": user.decode(), "purchases": count, "amount": amounts[user]}
        yield user, json.dumps(total).encode()


def run_pipeline(
    bootstrap: str, coordinator_url: str, checkpoint: str, args: argparse.Namespace
) -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import DataFrame, SparkSession

    from client.spark import register

    builder = (
        SparkSession.builder if args.master is None else SparkSession.builder.master(args.master)
    )
    builder = builder.appName("keyrange-spark-example")
    for key, value in spark_settings(args).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)

    # Written as for Spark's Kafka source; the last four options are Keyrange's.
    purchases = (
        spark.readStream.format("keyrange")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", args.input)
        .option("maxOffsetsPerTrigger", str(args.max_records_per_trigger))
        .option("coordinator", coordinator_url)
        .option("group", args.group)
        .option("slices_per_partition", str(args.slices))
        .option("slice_by", "keys")
        .load()
    )

    def write_totals(batch: DataFrame, batch_id: int) -> None:
        totals = batch.select("key", "value").rdd.mapPartitions(totals_per_user)
        if totals.isEmpty():
            return
        frame = spark.createDataFrame(totals, "key BINARY, value BINARY")
        (
            frame.write.format("keyrange")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", args.output)
            .mode("append")
            .save()
        )
        print(f"batch {batch_id}: per-user totals written to {args.output!r}", flush=True)

    query = (
        purchases.writeStream.foreachBatch(write_totals)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    # The source reports each finished batch, the last one before this returns.
    query.awaitTermination()
    spark.stop()


async def show_committed(coordinator_url: str, group: str, topic: str) -> None:
    async with CoordinatorClient(coordinator_url) as api:
        committed = await api.fetch_offsets(group, topics=[topic])
    for tp, state in sorted(committed.items()):
        print(f"committed {tp.topic}/{tp.partition}: stable offset {state.stable_offset}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


if __name__ == "__main__":
    main()
