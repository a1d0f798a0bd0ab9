"""The streams runtime's side of the kernel's byte budget (``client.runtime.budget``): the
kernel's intake charges every record it takes in, and this refunds what the tasks hold as it
leaves them: processed (counted by the task, refunded on the loop after the round, since a
pool thread may have processed it), given back to the consumer, or dropped with its task.

Paused partitions fetch again at half their share, the half the record bound this replaced
always resumed at; ``max_buffered_records``, deprecated, still counts records beside the bytes
(docs/streams.md, Backpressure).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiokafka.structs import TopicPartition

from client.runtime.budget import ByteBudget, weight
from client.streams.ports import StreamSource
from client.streams.task import StreamTask

_RESUME_RATIO = 0.5


class InputBudget:
    def __init__(
        self, source: StreamSource, max_buffered_bytes: int, max_buffered_records: int | None
    ) -> None:
        self._source = source
        self.budget = ByteBudget(
            max_buffered_bytes,
            _RESUME_RATIO,
            source.pause,
            source.resume,
            max_records=max_buffered_records,
        )

    def owned(self, slices: Iterable[tuple[TopicPartition, Any, Any]]) -> None:
        """The partitions of the owned slices share the bound."""
        self.budget.set_partitions(len({tp for tp, _, _ in slices}))

    def refund(self, tp: TopicPartition, record: Any) -> None:
        """A record taken in that no task keeps."""
        self.budget.refund(tp, weight(record))

    def give_back(self, tp: TopicPartition, record: Any) -> None:
        self.refund(tp, record)
        self._source.give_back(record)

    def processed(self, tasks: Iterable[StreamTask]) -> None:
        """After a round: what the tasks processed is no longer buffered (``processed`` keeps
        it until the commit only to mark it), and the refund may resume a partition."""
        for task in tasks:
            if task.taken:
                taken, task.taken = task.taken, {}
                for topic, (count, records) in taken.items():
                    self.budget.refund(TopicPartition(topic, task.id.partition), count, records)

    def drop(self, task: StreamTask) -> None:
        """The task goes: what it processed and what it still buffers is charged no more."""
        for record in task.inputs.drop(lambda _: False):
            self.budget.refund(TopicPartition(record.topic, task.id.partition), weight(record))
        self.processed([task])
