"""The runtime's tasks, indexed by (sub-topology, partition): a record's task is found among
the (usually one or two) key ranges of its partition, not by a scan of every task, and a
revocation's tasks among the partitions it names.

A topic is read by one sub-topology (``BuiltTopology.subtopology_of_topic``), so a record's
topic and partition name the one list its task can be in.
"""

from __future__ import annotations

from collections.abc import Iterator

from aiokafka.structs import TopicPartition

from client.http import Slices
from client.protocol.keyspace import KeyRange
from client.streams.task import StreamTask, TaskId
from client.streams.topology import BuiltTopology


class Tasks:
    def __init__(self, topology: BuiltTopology) -> None:
        self._topology = topology
        # In creation order, which is the order rounds visit the tasks in.
        self._by_id: dict[TaskId, StreamTask] = {}
        self._by_partition: dict[tuple[int, int], list[StreamTask]] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[StreamTask]:
        return iter(self._by_id.values())

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._by_id

    def values(self) -> list[StreamTask]:
        return list(self._by_id.values())

    def items(self) -> list[tuple[TaskId, StreamTask]]:
        return list(self._by_id.items())

    def get(self, task_id: TaskId) -> StreamTask | None:
        return self._by_id.get(task_id)

    def add(self, task: StreamTask) -> None:
        self._by_id[task.id] = task
        self._by_partition.setdefault((task.id.subtopology, task.id.partition), []).append(task)

    def remove(self, task: StreamTask) -> None:
        if self._by_id.pop(task.id, None) is None:
            return
        key = (task.id.subtopology, task.id.partition)
        siblings = self._by_partition[key]
        siblings.remove(task)
        if not siblings:
            del self._by_partition[key]

    def of_partition(self, tp: TopicPartition) -> list[StreamTask]:
        """The tasks that read ``tp``: those of its partition in the sub-topology reading its
        topic."""
        sub = self._topology.subtopology_of_topic(tp.topic)
        return self._by_partition.get((sub.index, tp.partition), [])

    def find(self, tp: TopicPartition, hashed: int) -> StreamTask | None:
        """The task whose range holds a record of ``tp`` with key hash ``hashed``."""
        for task in self.of_partition(tp):
            if task.id.keys.contains(hashed):
                return task
        return None

    def active(self, subtopology: int, partition: int, hashed: int) -> StreamTask | None:
        """The active task holding ``hashed`` (``StreamTask.active``): whose stores may be
        read for a query."""
        for task in self._by_partition.get((subtopology, partition), []):
            if task.active and task.id.keys.contains(hashed):
                return task
        return None

    def overlapping(self, task_id: TaskId) -> bool:
        """Whether a task of ``task_id``'s partition holds any of its keys."""
        return any(
            other.id.keys.overlaps(task_id.keys)
            for other in self._by_partition.get((task_id.subtopology, task_id.partition), [])
        )

    def in_slices(self, slices: Slices | None) -> list[StreamTask]:
        """The tasks holding keys of ``slices`` (every task for None), in creation order."""
        if slices is None:
            return self.values()
        return [
            task
            for task in self._by_id.values()
            if any(keys.overlaps(task.id.keys) for keys in self.revoked_keys(task, slices))
        ]

    def revoked_keys(self, task: StreamTask, slices: Slices) -> list[KeyRange]:
        """The ranges of ``slices`` over ``task``'s partition in the topics it reads."""
        sub = self._topology.subtopologies[task.id.subtopology]
        return [
            keys
            for tp, ranges in slices.items()
            if tp.partition == task.id.partition and tp.topic in sub.source_topics
            for keys in ranges
        ]
