"""What a worker reports on its optional metrics port (``client.metrics_server``): records
processed, failed, retried, dead-lettered and skipped, records in flight, buffered bytes and
their bound, paused partitions, the lag of every owned slice, and calls that cannot be stopped
holding the keys of slices the member gave up."""

from __future__ import annotations

from typing import TYPE_CHECKING

from client.metrics_server import Family
from client.runtime.gate import Running
from client.worker.source import slice_lag

if TYPE_CHECKING:
    from client.worker.runtime import WorkerRuntime

EXTRA = "worker"

_COUNTER_HELP = {
    "processed": "Records acknowledged as processed.",
    "failed": "Failed attempts (a failure acknowledged, an exception, or a timeout).",
    "retried": "Attempts scheduled again after a failure (policy retry).",
    "dead_lettered": "Records written to the dead-letter topic and acknowledged by the broker.",
    "skipped": "Failed records marked processed without retry (policy skip).",
}


def worker_families(
    runtime: WorkerRuntime | None, stuck: list[Running], buffered_bytes_bound: int
) -> list[Family]:
    """Before the runtime exists (the member has not joined yet) the gauges read 0 and the
    counters are absent, as they were before the worker had counted anything. The bound is
    exported beside the buffered bytes so a dashboard can draw one against the other."""
    families: list[Family] = []
    if runtime is not None:
        stats = runtime.stats
        counters = {
            "processed": stats.processed,
            "failed": stats.failed,
            "retried": stats.retried,
            "dead_lettered": stats.dead_lettered,
            "skipped": stats.skipped,
        }
        families.extend(
            Family(f"keyrange_worker_records_{name}", _COUNTER_HELP[name], "counter", (), [((), n)])
            for name, n in counters.items()
        )
    for name, text, value in (
        (
            "in_flight",
            "Records handed to user code without an outcome yet.",
            0 if runtime is None else runtime.in_flight,
        ),
        (
            "buffered_bytes",
            "Bytes of records taken from Kafka and not finished.",
            0 if runtime is None else runtime.buffered_bytes,
        ),
        (
            "buffered_bytes_bound",
            "The bound of buffered bytes (max_buffered_bytes): fetching pauses past it.",
            buffered_bytes_bound,
        ),
        (
            "paused_partitions",
            "Partitions whose fetching is paused (backpressure).",
            0 if runtime is None else len(runtime.paused),
        ),
        (
            "stuck_calls",
            "Calls that cannot be stopped (on threads) holding keys of slices given up.",
            len(stuck),
        ),
        (
            "stuck_call_max_seconds",
            "How long the oldest stuck call has been running (0 with none).",
            max((call.running_s() for call in stuck), default=0.0),
        ),
    ):
        families.append(Family(f"keyrange_worker_{name}", text, samples=[((), value)]))
    families.append(
        Family(
            "keyrange_worker_slice_lag",
            "Offsets between an owned slice's commit point and the partition's end.",
            labels=("topic", "partition", "key_start", "key_end"),
            samples=[]
            if runtime is None
            else [
                ((tp.topic, str(tp.partition), str(keys.start), str(keys.end)), lag)
                for tp, keys, lag in slice_lag(runtime.source)
            ],
        )
    )
    return families
