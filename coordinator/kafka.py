"""What the coordinator reads from the Kafka cluster: partition counts (to size assignments),
topic names (for pattern subscriptions), high watermarks (for lag and progress), and log start
offsets and offsets by time (for admin resets).

Three choices matter here:
- Metadata requests never create topics. aiokafka's admin ``describe_topics`` asks with
  ``allow_auto_topic_creation`` on, so asking about a mistyped subscription would create it.
- High watermarks come from a fetch response, not from ListOffsets "latest" (which some
  Kafka-protocol brokers answer wrongly). One fetch per leader covers all its partitions;
  each partition is fetched at the watermark seen last time, so a steady cluster returns
  no records at all, and the response is capped at one byte so a busy one returns at most
  one record batch.
- Every call is bounded by ``request_timeout_ms``; a cluster that does not answer in time
  is :class:`KafkaUnavailable`, which callers retry.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import aiokafka.errors as kafka_errors
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.admin import CreateTopicsRequest
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.protocol.offset import OffsetRequest

from client.kafka_security import KafkaSecurity

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

# Long enough for a loaded broker, short enough that a coordinator polling every few
# seconds notices an outage within one or two rounds.
DEFAULT_REQUEST_TIMEOUT_MS = 5_000

# Kafka answers at once when min_bytes is 0. Some Kafka-protocol brokers instead hold a
# fetch at the log end for max_wait, and send an empty response when it is 0.
_FETCH_MAX_WAIT_MS = 10
# Smallest response cap: Kafka still returns one batch from the first partition that has
# data (its progress guarantee), every other partition returns only its watermark.
_FETCH_MAX_BYTES = 1
_READ_UNCOMMITTED = 0
_EARLIEST_TIMESTAMP = -2
# One retry after refreshing metadata covers a leader move; more belongs to the caller,
# which polls again in a few seconds anyway.
_ROUNDS = 2
_TOPIC_VISIBLE_POLL_S = 0.05


class KafkaClusterError(Exception):
    """Root of the errors this module raises; ``retriable`` says whether to try again."""

    retriable: bool = False


class KafkaUnavailable(KafkaClusterError):
    """The cluster could not be reached, or did not answer within the request timeout."""

    retriable = True


class TopicCreationFailed(KafkaClusterError):
    """The cluster refused to create a topic (bad partition count, policy, ...)."""


@dataclass(frozen=True)
class _Layout:
    """One metadata response, reduced to what this module uses."""

    partition_counts: dict[str, int] = field(default_factory=dict)
    leaders: dict[TopicPartition, int] = field(default_factory=dict)
    internal_topics: frozenset[str] = frozenset()
    controller: int | None = None


class _Connection:
    """The one client connection every request goes through: made on first use, and made
    again on the next call after it failed, so a coordinator that came up before Kafka
    recovers on its own. It also bounds each operation and names its failures."""

    def __init__(
        self,
        bootstrap: str,
        request_timeout_ms: int,
        client_id: str,
        security: KafkaSecurity | None,
    ) -> None:
        self.bootstrap = bootstrap
        self.request_timeout_ms = request_timeout_ms
        # Built once: the TLS context reads its files here, not at every reconnection.
        self._security_options = (security or KafkaSecurity()).aiokafka_options()
        self._client_id = client_id
        self._client: AIOKafkaClient | None = None
        self._connected = False
        self._connect_lock = asyncio.Lock()

    async def ready(self) -> AIOKafkaClient:
        async with self._connect_lock:
            if self._client is None:
                self._client = AIOKafkaClient(
                    bootstrap_servers=self.bootstrap,
                    client_id=self._client_id,
                    request_timeout_ms=self.request_timeout_ms,
                    **self._security_options,
                )
            if not self._connected:
                await self._client.bootstrap()
                self._connected = True
            return self._client

    async def close(self) -> None:
        client, self._client = self._client, None
        self._connected = False
        if client is not None:
            await client.close()

    async def send(self, node: int, request: Any) -> Any:
        client = await self.ready()
        return await client.send(node, request)

    def any_node(self) -> int:
        client = self._client
        node = client.get_random_node() if client is not None else None
        if node is None:
            raise KafkaUnavailable(f"no broker known for the Kafka cluster at {self.bootstrap}")
        return int(node)

    async def layout(self, topics: list[str] | None) -> _Layout:
        """Metadata for ``topics`` (None: all), from the first broker that answers."""
        client = await self.ready()
        request = MetadataRequest(topics, allow_auto_topic_creation=False)
        nodes = [broker.nodeId for broker in client.cluster.brokers()]
        random.shuffle(nodes)
        last_error: Exception | None = None
        for node in nodes:
            try:
                reply = await client.send(node, request)
            except kafka_errors.KafkaError as err:
                if not err.retriable:
                    raise
                last_error = err
                continue
            metadata = reply.to_object()
            known = {broker.nodeId for broker in client.cluster.brokers()}
            if {broker["node_id"] for broker in metadata["brokers"]} - known:
                # The client connects only to brokers it knows; a new leader needs a refresh.
                # (Not update_metadata with this reply: it warns about every unknown topic.)
                await client.force_metadata_update()
            return _layout_of(metadata)
        raise KafkaUnavailable(
            f"no broker of the Kafka cluster at {self.bootstrap} answered a metadata request"
            + (f": {last_error}" if last_error else "")
        )

    @asynccontextmanager
    async def bounded(self, doing: str) -> AsyncIterator[None]:
        """Bound a whole operation by the request timeout and name failures for humans."""
        try:
            async with asyncio.timeout(self.request_timeout_ms / 1000):
                yield
        except TimeoutError as err:
            raise KafkaUnavailable(
                f"Kafka at {self.bootstrap} did not answer within "
                f"{self.request_timeout_ms} ms ({doing})"
            ) from err
        except kafka_errors.KafkaError as err:
            if err.retriable or err.invalid_metadata:
                raise KafkaUnavailable(
                    f"Kafka at {self.bootstrap} is unreachable ({doing}): {err}"
                ) from err
            raise KafkaClusterError(f"Kafka at {self.bootstrap} failed {doing}: {err}") from err


class _OffsetLookup:
    """ListOffsets: log start offsets and offsets by time, each partition asked of its
    leader. Never used for the log end (see the module's note on high watermarks)."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection

    async def log_starts(
        self, node: int, partitions: set[TopicPartition]
    ) -> dict[TopicPartition, int]:
        found = await self.from_node(node, partitions, _EARLIEST_TIMESTAMP)
        return {tp: offset for tp, offset in found.items() if offset is not None}

    async def at(
        self, wanted: set[TopicPartition], timestamp: int
    ) -> dict[TopicPartition, int | None]:
        """ListOffsets for ``timestamp`` (or the earliest marker), each partition asked of its
        leader; partitions without a leader or unknown to the cluster are absent."""
        if not wanted:
            return {}
        layout = await self._connection.layout(sorted({topic for topic, _ in wanted}))
        by_leader: dict[int, set[TopicPartition]] = defaultdict(set)
        for tp in wanted:
            leader = layout.leaders.get(tp)
            if leader is not None and leader >= 0:
                by_leader[leader].add(tp)
        replies = await asyncio.gather(
            *(self.from_node(node, tps, timestamp) for node, tps in by_leader.items())
        )
        return {tp: offset for reply in replies for tp, offset in reply.items()}

    async def from_node(
        self, node: int, partitions: set[TopicPartition], timestamp: int
    ) -> dict[TopicPartition, int | None]:
        """One ListOffsets to one broker; an offset of -1 (no record at or after the time)
        becomes None."""
        by_topic: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for topic, partition in sorted(partitions):
            by_topic[topic].append((partition, timestamp))
        reply = await self._connection.send(
            node, OffsetRequest(-1, _READ_UNCOMMITTED, list(by_topic.items()))
        )
        offsets: dict[TopicPartition, int | None] = {}
        for topic, partition_replies in reply.topics:
            for partition, error_code, *info in partition_replies:
                if error_code == 0:
                    # v0 answers a list of offsets; v1+ answers (timestamp, offset, ...).
                    offset = info[0][0] if reply.API_VERSION == 0 else info[1]
                    offsets[(topic, partition)] = offset if offset >= 0 else None
        return offsets


class _Watermarks:
    """High watermarks read from fetch responses, each partition fetched at the watermark
    it had last time (the module's note says why not ListOffsets)."""

    def __init__(self, connection: _Connection, offsets: _OffsetLookup) -> None:
        self._connection = connection
        self._offsets = offsets
        # Where to fetch each partition next time: the last high watermark seen.
        self._positions: dict[TopicPartition, int] = {}

    async def read(self, wanted: set[TopicPartition]) -> dict[TopicPartition, int]:
        found: dict[TopicPartition, int] = {}
        pending = wanted
        for _ in range(_ROUNDS):
            layout = await self._connection.layout(sorted({topic for topic, _ in pending}))
            by_leader: dict[int, list[TopicPartition]] = defaultdict(list)
            retry: set[TopicPartition] = set()
            for tp in sorted(pending):
                leader = layout.leaders.get(tp)
                if leader is None:
                    continue
                if leader < 0:
                    retry.add(tp)
                else:
                    by_leader[leader].append(tp)
            replies = await asyncio.gather(
                *(self._fetch_from_leader(node, tps) for node, tps in by_leader.items())
            )
            for watermarks, again in replies:
                found.update(watermarks)
                retry |= again
            if not retry:
                break
            pending = retry
        missing = wanted - found.keys()
        if missing:
            logger.debug(
                "no high watermark for some partitions",
                extra={"partitions": sorted(missing)[:20], "count": len(missing)},
            )
        return found

    async def _fetch_from_leader(
        self, node: int, partitions: list[TopicPartition]
    ) -> tuple[dict[TopicPartition, int], set[TopicPartition]]:
        """One fetch to one leader: the watermarks it gave, and the partitions to retry."""
        positions = {tp: self._positions.get(tp, 0) for tp in partitions}
        by_topic: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
        for (topic, partition), position in positions.items():
            by_topic[topic].append((partition, position, _FETCH_MAX_BYTES))
        request = FetchRequest(
            max_wait_time=_FETCH_MAX_WAIT_MS,
            min_bytes=0,
            max_bytes=_FETCH_MAX_BYTES,
            isolation_level=_READ_UNCOMMITTED,
            topics=list(by_topic.items()),
        )
        try:
            reply = await self._connection.send(node, request)
        except kafka_errors.KafkaError as err:
            if not err.retriable:
                raise
            logger.info("fetch from broker failed", extra={"node": node, "error": str(err)})
            return {}, set(partitions)
        watermarks: dict[TopicPartition, int] = {}
        out_of_range: set[TopicPartition] = set()
        retry: set[TopicPartition] = set()
        for topic, partition_replies in reply.topics:
            for partition, error_code, high_watermark, *_ in partition_replies:
                tp = (topic, partition)
                if tp not in positions:
                    continue
                error = kafka_errors.for_code(error_code)
                if error is kafka_errors.NoError:
                    watermarks[tp] = high_watermark
                    self._positions[tp] = high_watermark
                elif error is kafka_errors.OffsetOutOfRangeError:
                    out_of_range.add(tp)
                elif error.retriable or error.invalid_metadata:
                    retry.add(tp)
                else:
                    logger.warning(
                        "cannot read a high watermark",
                        extra={"topic": topic, "partition": partition, "error": error.message},
                    )
        # A partition the broker left out of its answer is asked again next round.
        retry |= set(positions) - watermarks.keys() - out_of_range - retry
        if out_of_range:
            # The log was truncated or deleted below our position: restart from its start.
            self._positions.update(await self._offsets.log_starts(node, out_of_range))
            retry |= out_of_range
        return watermarks, retry


class ClusterMetadata:
    """A read-mostly view of one Kafka cluster for the coordinator: what it may ask, each
    question bounded by the request timeout.

    ``start()`` connects; if the cluster is down then, later calls connect again, so a
    coordinator that came up before Kafka recovers on its own.
    """

    def __init__(
        self,
        bootstrap: str,
        *,
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        client_id: str = "keyrange-coordinator",
        security: KafkaSecurity | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.request_timeout_ms = request_timeout_ms
        self._connection = _Connection(bootstrap, request_timeout_ms, client_id, security)
        self._offsets = _OffsetLookup(self._connection)
        self._watermarks = _Watermarks(self._connection, self._offsets)

    @property
    def connection(self) -> _Connection:
        """The shared connection, for the modules that ask the cluster other questions
        (``coordinator.kafka_groups``) over the same client and security settings."""
        return self._connection

    async def start(self) -> None:
        async with self._connection.bounded("connecting"):
            await self._connection.ready()

    async def close(self) -> None:
        await self._connection.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        """Partition count per existing topic; topics that do not exist are absent."""
        names = sorted(set(topics))
        if not names:
            return {}
        async with self._connection.bounded("reading topic metadata"):
            layout = await self._connection.layout(names)
        return layout.partition_counts

    async def list_topics(self) -> set[str]:
        """Every topic but Kafka's internal ones, as a consumer's pattern subscription sees."""
        async with self._connection.bounded("listing topics"):
            layout = await self._connection.layout(None)
        return set(layout.partition_counts) - layout.internal_topics

    async def high_watermarks(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]:
        """High watermark per partition; unknown or leaderless partitions are absent."""
        wanted = set(partitions)
        if not wanted:
            return {}
        async with self._connection.bounded("reading high watermarks"):
            return await self._watermarks.read(wanted)

    async def log_start_offsets(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]:
        """First offset still in each partition's log; unknown partitions are absent."""
        async with self._connection.bounded("reading log start offsets"):
            found = await self._offsets.at(set(partitions), _EARLIEST_TIMESTAMP)
        return {tp: offset for tp, offset in found.items() if offset is not None}

    async def offsets_for_time(
        self, partitions: Iterable[TopicPartition], timestamp_ms: int
    ) -> dict[TopicPartition, int | None]:
        """Per partition, the first offset whose record's timestamp is at or after
        ``timestamp_ms``, None when no record is that late; unknown partitions are absent."""
        if timestamp_ms < 0:
            raise ValueError(f"a record timestamp is not negative, not {timestamp_ms}")
        async with self._connection.bounded("looking up offsets by time"):
            return await self._offsets.at(set(partitions), timestamp_ms)

    async def create_topic(
        self,
        name: str,
        partitions: int,
        *,
        replication_factor: int = 1,
        config: Mapping[str, str] | None = None,
    ) -> bool:
        """Create a topic unless it exists; True when this call created it.

        Returns once the topic is visible in metadata, so the caller can produce to it
        and count its partitions straight away.
        """
        if partitions < 1:
            # Checked here because not every Kafka-protocol broker refuses it.
            raise ValueError(f"a topic needs at least one partition, not {partitions}")
        request = CreateTopicsRequest(
            create_topic_requests=[
                (name, partitions, replication_factor, [], list((config or {}).items()))
            ],
            # Half the budget: the rest is for retrying and waiting until metadata shows it.
            timeout=self.request_timeout_ms // 2,
            validate_only=False,
        )
        async with self._connection.bounded(f"creating topic {name!r}"):
            for _ in range(_ROUNDS):
                layout = await self._connection.layout([name])
                if name in layout.partition_counts:
                    return False
                node = (
                    layout.controller
                    if layout.controller is not None
                    else self._connection.any_node()
                )
                reply = await self._connection.send(node, request)
                error = kafka_errors.for_code(reply.topic_errors[0][1])
                if error is kafka_errors.NoError:
                    await self._until_visible(name)
                    logger.info("created topic", extra={"topic": name, "partitions": partitions})
                    return True
                if error is kafka_errors.TopicAlreadyExistsError:
                    return False
                if not (error.retriable or error.invalid_metadata):
                    detail = reply.topic_errors[0][2] if len(reply.topic_errors[0]) > 2 else None
                    raise TopicCreationFailed(
                        f"cannot create topic {name!r}: {error.message}"
                        + (f" ({detail})" if detail else "")
                    )
            raise KafkaUnavailable(f"Kafka at {self.bootstrap} kept refusing to create {name!r}")

    async def _until_visible(self, name: str) -> None:
        """Kafka creates topics asynchronously; wait until metadata shows this one."""
        while True:
            layout = await self._connection.layout([name])
            if name in layout.partition_counts:
                return
            await asyncio.sleep(_TOPIC_VISIBLE_POLL_S)


def _layout_of(metadata: dict[str, Any]) -> _Layout:
    counts: dict[str, int] = {}
    leaders: dict[TopicPartition, int] = {}
    internal: set[str] = set()
    for topic in metadata["topics"]:
        if topic["error_code"] != 0:
            continue
        name = topic["topic"]
        counts[name] = len(topic["partitions"])
        if topic.get("is_internal"):
            internal.add(name)
        for partition in topic["partitions"]:
            leaders[(name, partition["partition"])] = partition["leader"]
    controller = metadata.get("controller_id")
    return _Layout(
        partition_counts=counts,
        leaders=leaders,
        internal_topics=frozenset(internal),
        controller=controller if controller is not None and controller >= 0 else None,
    )
