"""Interactive queries: which instance owns a store's key, and reads of this instance's own
part of a store (docs/streams.md, "Interactive queries").

A key lives in one task: its partition by Kafka's default partitioner over its sub-topology's
partition count, its key hash in the task's range. A read is answered here only from an
active task (running, not halted by a lost membership nor closing under a revocation);
otherwise the coordinator's view of the group names the owner, and with it the address the
owner advertised (``KeyOwner.endpoint``), which the HTTP server forwards or redirects to.
One description of the group serves the look-ups of ``OWNERS_TTL_S``.

Range scans answer from this instance's tasks only: keys are spread over every instance by
their hash, so a scan of the whole store asks each instance (Kafka Streams' range queries
are per instance too). A key's read runs on the event loop, where the rounds on the loop
write; scans run on the query server's threads (``client.streams.routes``), so the loop never
waits for a big one. With ``processing_threads`` above 1, or during a scan, a read may see a
round's writes half done, as it may in Kafka Streams with its stream threads.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from aiokafka.partitioner import DefaultPartitioner

from client.http import CoordinatorClient, GroupOwners, KeyOwner
from client.protocol.keyspace import key_hash
from client.streams.errors import StreamsError, UnknownStore
from client.streams.runtime import StreamsRuntime
from client.streams.stores import TaskStore
from client.streams.task import StreamTask
from client.streams.topology import BuiltTopology, StoreSpec, SubTopology

# How long one description of the group names the owners of keys: a look-up per query would
# cost a coordinator read each (tens of ms), while ownership moves only at a rebalance, after
# which a stale owner answers "not mine" and the description is asked again.
OWNERS_TTL_S = 1.0


class NotAWindowStore(StreamsError):
    """A time-range read asked of a key-value store."""


class NotAKeyValueStore(StreamsError):
    """A key-range scan asked of a window store, whose reads take a time range."""


@dataclass(frozen=True)
class QueryAnswer:
    """``value`` when this instance owns the key (``local``; None when the store has no
    value for it); otherwise ``owner`` names the member that does (its instance id, else its
    member id; None while nobody does, e.g. during a hand-off) and ``endpoint`` where it
    serves queries (None when it advertised none)."""

    local: bool
    value: Any = None
    owner: str | None = None
    endpoint: str | None = None


@runtime_checkable
class WindowReads(Protocol):
    """What a window store offers to queries, as Kafka Streams' ``ReadOnlyWindowStore``:
    one key's windows that start in ``[time_from, time_to]`` (ms) as ``(start, end, value)``,
    and every key's in a key range, or of every key (``fetch_all``), as ``(key, start, end,
    value)`` (``client.streams.window_store.TaskWindowStore``)."""

    def fetch(self, key: Any, time_from: int, time_to: int) -> list[tuple[int, int, Any]]: ...

    def fetch_range(
        self, low: Any, high: Any, time_from: int, time_to: int
    ) -> list[tuple[Any, int, int, Any]]: ...

    def fetch_all(self, time_from: int, time_to: int) -> list[tuple[Any, int, int, Any]]: ...


@dataclass(frozen=True)
class Located:
    """Where a key of a store lives: its sub-topology, partition and hash, and the task of
    this instance that may answer for it (None: another instance, or nobody now)."""

    spec: StoreSpec
    sub: SubTopology
    partition: int
    hashed: int
    task: StreamTask | None


class StoreQueries:
    """The query side of one ``StreamsApp``: ``runtime`` gives its current runtime (None
    until the first assignment) and ``partitions`` the source topics' partition counts (known
    once ``run`` created the changelogs)."""

    def __init__(
        self,
        topology: BuiltTopology,
        application_id: str,
        coordinator: CoordinatorClient,
        partitions: Mapping[str, int],
        runtime: Callable[[], StreamsRuntime | None],
    ) -> None:
        self._topology = topology
        self._application_id = application_id
        self._coordinator = coordinator
        self._partitions = partitions
        self._runtime = runtime
        self._owners: tuple[float, asyncio.Future[GroupOwners]] | None = None

    @property
    def check_topic(self) -> str:
        """A topic of the group, for the coordinator's token checks (``query_auth``)."""
        return self._topology.source_topics[0]

    def spec(self, store: str) -> StoreSpec:
        spec = self._topology.stores.get(store)
        if spec is None:
            raise UnknownStore(f"store '{store}' is not in this topology")
        return spec

    def locate(self, store: str, key: Any) -> Located:
        spec = self.spec(store)
        raw = spec.key_serde.serialize(key)
        if raw is None:
            raise StreamsError("a store key cannot be None")
        sub = self._subtopology(store)
        count = min(self._partitions.get(topic, 1) for topic in sub.source_topics)
        partition = DefaultPartitioner()(raw, list(range(count)), list(range(count)))
        hashed = key_hash(raw, 0)
        runtime = self._runtime()
        task = None if runtime is None else runtime.tasks.active(sub.index, partition, hashed)
        return Located(spec, sub, partition, hashed, task)

    async def owner(self, located: Located) -> KeyOwner | None:
        """The member owning the key in the coordinator's view of the group, as described at
        most ``OWNERS_TTL_S`` ago."""
        owners = await self._group_owners()
        owner = owners.owner_of(located.sub.source_topics[0], located.partition, located.hashed)
        if owner is None:
            # A hand-off, as that description saw it: whoever retries asks afresh.
            self.forget_owners()
        return owner

    def forget_owners(self) -> None:
        """Ask the coordinator again next time: an owner named from the kept description
        did not own the key any more, or did not answer."""
        self._owners = None

    async def _group_owners(self) -> GroupOwners:
        """One description of the group for every look-up within ``OWNERS_TTL_S``, asked
        once however many queries wait for it."""
        now = time.monotonic()
        kept = self._owners
        if kept is None or kept[0] <= now:
            asked = asyncio.ensure_future(self._coordinator.group_owners(self._application_id))
            # Its failure is every waiter's; with none left (all cancelled), it is not news.
            asked.add_done_callback(lambda done: done.cancelled() or done.exception())
            kept = self._owners = (now + OWNERS_TTL_S, asked)
        try:
            return await asyncio.shield(kept[1])
        except Exception:
            if self._owners is kept:
                self._owners = None
            raise

    async def query(self, store: str, key: Any) -> QueryAnswer:
        located = self.locate(store, key)
        if located.task is not None:
            return QueryAnswer(local=True, value=located.task.stores[store].get(key))
        owner = await self.owner(located)
        return QueryAnswer(
            local=False,
            owner=None if owner is None else owner.name,
            endpoint=None if owner is None else owner.endpoint,
        )

    def range_scan(
        self, store: str, low: Any, high: Any, count: int
    ) -> Callable[[], list[tuple[Any, Any]]]:
        """A scan of this instance's first ``count`` keys of ``store`` in ``[low, high]`` (both
        None: all of them), in the order of their serialized bytes, as the stores keep them,
        to run off the loop. The tasks are chosen here, on the loop, where they change; each
        task's store is then read only as far as the answer needs (``TaskStore.scan``)."""
        spec = self.spec(store)
        scans = []
        for task in self._active_tasks(store):
            view = task.stores[store]
            if not isinstance(view, TaskStore):
                raise NotAKeyValueStore(
                    f"store '{store}' is a window store: scan it with /windows and a time range"
                )
            scans.append(view.scan(low, high))
        serialized = spec.key_serde.serialize

        def scan() -> list[tuple[Any, Any]]:
            merged = heapq.merge(*scans, key=lambda pair: serialized(pair[0]) or b"")
            return list(itertools.islice(merged, count))

        return scan

    def windows(self, located: Located, key: Any, time_from: int, time_to: int) -> list[Any]:
        """One key's windows from its local task (``located.task`` must be set)."""
        assert located.task is not None
        return list(_window_reads(located.task, located.spec.name).fetch(key, time_from, time_to))

    def window_scan(
        self, store: str, low: Any, high: Any, time_from: int, time_to: int, count: int
    ) -> Callable[[], list[tuple[Any, int, int, Any]]]:
        """A scan of this instance's first ``count`` windows of keys in ``[low, high]`` (both
        None: every key) starting in the time range, in key then start order, to run off the
        loop (the tasks chosen here, as ``range_scan``)."""
        spec = self.spec(store)
        reads = [_window_reads(task, store) for task in self._active_tasks(store)]
        serialized = spec.key_serde.serialize

        def scan() -> list[tuple[Any, int, int, Any]]:
            found: list[tuple[Any, int, int, Any]] = []
            for read in reads:
                if low is None and high is None:
                    found.extend(read.fetch_all(time_from, time_to))
                else:
                    found.extend(read.fetch_range(low, high, time_from, time_to))
            return heapq.nsmallest(
                count, found, key=lambda entry: (serialized(entry[0]) or b"", entry[1])
            )

        return scan

    def _subtopology(self, store: str) -> SubTopology:
        return next(sub for sub in self._topology.subtopologies if store in sub.stores)

    def _active_tasks(self, store: str) -> list[StreamTask]:
        runtime = self._runtime()
        if runtime is None:
            return []
        index = self._subtopology(store).index
        return [
            task
            for task_id, task in runtime.tasks.items()
            if task_id.subtopology == index and task.active
        ]


def _window_reads(task: StreamTask, store: str) -> WindowReads:
    view = task.stores[store]
    if not isinstance(view, WindowReads):
        raise NotAWindowStore(f"store '{store}' is a key-value store: it has no time ranges")
    return view
