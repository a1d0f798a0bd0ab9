"""The worker runtime: kafka-workers' task model on key-range slices (docs/workers.md).

A task per sub-partition, acknowledged through an observer from anywhere::

    from client.worker import Worker, WorkerConfig, WorkerTask

    class Billing(WorkerTask):
        async def process(self, record, observer):
            await charge(record.value)
            observer.success()

    config = WorkerConfig(
        topics=["orders"],
        group_id="billing",
        bootstrap_servers="localhost:9092",
        coordinator_url="http://localhost:8080",
        failure_policy="retry",
    )
    await Worker(config, task=Billing).run(handle_signals=True)

or a plain handler, every key its own lane: ``Worker(config, handler=handle)``. The same runs
without code around it as ``keyrange worker my_module:Billing --topics orders ...``.
"""

from client.worker.app import Worker
from client.worker.config import FailurePolicy, WorkerConfig
from client.worker.failures import ProcessingTimeout, WorkerFailed
from client.worker.outcomes import Stats
from client.worker.task import (
    KeyHashPartitioner,
    Partitioner,
    RecordObserver,
    SubPartition,
    WorkerTask,
)

__all__ = [
    "FailurePolicy",
    "KeyHashPartitioner",
    "Partitioner",
    "ProcessingTimeout",
    "RecordObserver",
    "Stats",
    "SubPartition",
    "Worker",
    "WorkerConfig",
    "WorkerFailed",
    "WorkerTask",
]
