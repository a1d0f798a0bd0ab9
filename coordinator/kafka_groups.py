"""Kafka consumer groups as the coordinator's offset mirror sees them (coordinator/mirror.py):
who coordinates a group, whether it has members, what it has committed, and a commit as a
group with no members makes one.

The commit is Kafka's "simple consumer" commit, the one aiokafka sends for a consumer with a
``group_id`` and manually assigned partitions: generation -1 and no member id. Kafka accepts
it only for a group with no live members, so a Kafka group that real consumers use is never
overwritten; the mirror checks for members first and names the group once when it skips it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import aiokafka.errors as kafka_errors
from aiokafka.protocol.admin import DescribeGroupsRequest
from aiokafka.protocol.commit import OffsetCommitRequest, OffsetFetchRequest
from aiokafka.protocol.coordination import FindCoordinatorRequest

from coordinator.kafka import ClusterMetadata, KafkaClusterError, TopicPartition

_GROUP_COORDINATOR = 0
# Kafka keeps simple-consumer commits for its own offsets.retention.minutes.
_BROKER_RETENTION = -1


class GroupCommitRefused(KafkaClusterError):
    """The group's coordinator refused a commit (live members, authorization, ...)."""


@dataclass(frozen=True)
class KafkaGroupState:
    """``members``: live members of the Kafka group; ``state`` as Kafka names it ("Empty",
    "Stable", "Dead", ...)."""

    state: str
    members: int


class KafkaGroups:
    """Reads and simple-consumer commits of Kafka consumer groups over the coordinator's
    one Kafka connection, each bounded by its request timeout."""

    def __init__(self, cluster: ClusterMetadata) -> None:
        self._connection = cluster.connection
        # Each group's coordinator, looked up once: the mirror makes one of these per round,
        # so a coordinator that moved is found again the next round.
        self._coordinators: dict[str, int] = {}

    async def _coordinator(self, group: str) -> int:
        known = self._coordinators.get(group)
        if known is not None:
            return known
        await self._connection.ready()
        reply = await self._connection.send(
            self._connection.any_node(), FindCoordinatorRequest(group, _GROUP_COORDINATOR)
        )
        error = kafka_errors.for_code(reply.error_code)
        if error is not kafka_errors.NoError:
            raise error(f"no coordinator for group {group!r}")
        self._coordinators[group] = int(reply.coordinator_id)
        return self._coordinators[group]

    async def describe(self, group: str) -> KafkaGroupState:
        async with self._connection.bounded(f"describing group {group!r}"):
            node = await self._coordinator(group)
            reply = await self._connection.send(node, DescribeGroupsRequest([group]))
        # (error code, group, state, protocol type, protocol, members, ...) in every version.
        error_code, _, state, _, _, members, *_ = reply.groups[0]
        error = kafka_errors.for_code(error_code)
        if error is not kafka_errors.NoError:
            raise KafkaClusterError(f"cannot describe group {group!r}: {error.message}")
        return KafkaGroupState(state=state, members=len(members))

    async def committed(
        self, group: str, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, int]:
        """The group's committed offsets for ``partitions``; those it has none for are absent."""
        by_topic: dict[str, list[int]] = defaultdict(list)
        for topic, partition in sorted(partitions):
            by_topic[topic].append(partition)
        async with self._connection.bounded(f"reading offsets of group {group!r}"):
            node = await self._coordinator(group)
            reply = await self._connection.send(
                node, OffsetFetchRequest(group, list(by_topic.items()))
            )
        found: dict[TopicPartition, int] = {}
        for topic, partition_replies in reply.topics:
            for partition, offset, _metadata, error_code in partition_replies:
                if error_code == 0 and offset >= 0:
                    found[(topic, partition)] = offset
        return found

    async def commit(
        self, group: str, offsets: Mapping[TopicPartition, int], metadata: str
    ) -> None:
        """Commit ``offsets`` as a group with no members; :class:`GroupCommitRefused` names
        the first partition error."""
        by_topic: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
        for (topic, partition), offset in sorted(offsets.items()):
            by_topic[topic].append((partition, offset, metadata))
        request = OffsetCommitRequest(
            group,
            OffsetCommitRequest.DEFAULT_GENERATION_ID,
            "",
            _BROKER_RETENTION,
            list(by_topic.items()),
        )
        async with self._connection.bounded(f"committing offsets of group {group!r}"):
            node = await self._coordinator(group)
            reply = await self._connection.send(node, request)
        for topic, partition_replies in reply.topics:
            for partition, error_code in partition_replies:
                error = kafka_errors.for_code(error_code)
                if error is not kafka_errors.NoError:
                    raise GroupCommitRefused(
                        f"Kafka refused offsets of group {group!r} "
                        f"({topic}[{partition}]): {error.__name__}"
                    )
