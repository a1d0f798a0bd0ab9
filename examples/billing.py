"""The README's worker: ``keyrange worker examples.billing:Billing``.

A ``WorkerTask`` per sub-partition that "charges" each order (a short sleep standing for a
payment API) and acknowledges it when the charge is done, from a task of its own, as
docs/workers.md's first example does. It keeps a running total per customer (the record's key)
and logs the totals when a punctuation finds them changed and when its partition is closed, so
two workers started side by side show how the orders split between them. Try it on records from
``keyrange topic produce orders``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from client.fetcher import Record
from client.worker import RecordObserver, SubPartition, WorkerConfig, WorkerTask

logger = logging.getLogger("examples.billing")

CHARGE_S = 0.005  # what a payment API call might take


class Billing(WorkerTask):
    def init(self, subpartition: SubPartition, config: WorkerConfig) -> None:
        self.subpartition = subpartition
        self.charged: Counter[str] = Counter()
        self.pending: set[asyncio.Task[None]] = set()
        self.reported = 0

    async def process(self, record: Record, observer: RecordObserver) -> None:
        charge = asyncio.create_task(self.charge(record, observer))
        self.pending.add(charge)
        charge.add_done_callback(self.pending.discard)

    async def charge(self, record: Record, observer: RecordObserver) -> None:
        try:
            await asyncio.sleep(CHARGE_S)
            customer = record.key.decode() if isinstance(record.key, bytes) else str(record.key)
            self.charged[customer] += 1
            observer.success()
        except Exception as error:
            observer.failure(error)

    def punctuate(self, now: float) -> None:
        if sum(self.charged.values()) != self.reported:
            self.report("billing totals")

    def close(self) -> None:
        self.report("billing closed")

    def report(self, message: str) -> None:
        self.reported = sum(self.charged.values())
        where = f"{self.subpartition.topic}[{self.subpartition.partition}]"
        logger.info(
            message,
            extra={"partition": where, "orders": self.reported, "customers": len(self.charged)},
        )
