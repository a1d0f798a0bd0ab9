"""``KeyrangeConsumer``: a Kafka consumer that owns key-range slices instead of partitions.

It reads Kafka with one ``AIOKafkaConsumer`` in manual-assignment mode (membership is the
coordinator's, never a Kafka group), keeps the records whose key hash falls in an owned slice
and that the group has not processed yet, and commits what was processed to the coordinator
(``client.tracker`` builds the payload). Records of one key reach user code in offset order
and one at a time: ``async for`` and ``getmany`` hand records out in partition order, and
``run`` keeps one chain per key while different keys run concurrently.

Nothing is handed out once the membership is lost: before every hand-out (``records``,
``getmany``, ``run``'s workers, and before buffering a fetch) the consumer asks
``Membership.session_lost``, which reads the session deadline off the monotonic clock, so a
member frozen or blocked past its session hands out nothing after it resumes, even before its
heartbeat learns what the coordinator did meanwhile (DESIGN §5, docs/membership.md).

Delivery is at least once. A record counts as processed when it is marked: ``async for``
marks the previous record when the next one is requested (unless ``auto_mark=False``),
``getmany`` leaves marking to the caller, ``run`` marks after the handler returns.

Concerns and their tasks: the Kafka fetch runs in the caller's ``async for``/``getmany``
(aiokafka prefetches in its own task), periodic commits in one task, and in group mode the
heartbeat and the reconciliation in one task each (``client.membership``). ``stop`` shuts
them down in a fixed order: reconciliation, final commit, leave the group, Kafka, HTTP.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from itertools import compress
from operator import is_
from types import TracebackType
from typing import Any, TypeAlias

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from client.errors import (
    FencedMemberEpoch,
    IndividualCommitNotAllowed,
    InvalidRequest,
    KeyrangeClientError,
    UnknownMemberId,
)
from client.http import CoordinatorClient, Slices
from client.keyspace import HASH_MAX, HASH_MIN, KeyRange, key_hash, murmur3_halves, normalize
from client.membership import Membership, Reconciler
from client.tracker import CommitMode, OffsetTracker, SliceProgress

logger = logging.getLogger(__name__)

# aiokafka ships no type information; at runtime this is ``aiokafka.structs.ConsumerRecord``.
Record: TypeAlias = Any
Handler = Callable[[Record], Awaitable[object]]
_Item = tuple[TopicPartition, Record, int]

# One internal Kafka poll never holds the fetch lock longer than this, so an assignment
# change waits at most this long for its turn.
_POLL_SLICE_S = 0.2
# The coordinator's default max_ranges_per_request (DESIGN §3.1).
_MAX_RANGES_PER_REQUEST = 60_000
# Time for the final commit and the leave after in-flight handlers had revoke_timeout_s:
# a few HTTP calls with their retries.
_CLOSE_GRACE_S = 30.0


class RebalanceListener:
    """Callbacks on slice ownership changes, each given ``{TopicPartition: [KeyRange]}``.

    ``on_slices_revoked`` runs after in-flight records of the slices finished (or the revoke
    timeout passed) and their progress was committed; ``on_slices_lost`` runs when the
    slices were taken away without a chance to commit (fenced, session expired), and by
    default does what ``on_slices_revoked`` does, as Kafka's ``onPartitionsLost`` does.
    """

    async def on_slices_assigned(self, slices: Slices) -> None:
        return None

    async def on_slices_revoked(self, slices: Slices) -> None:
        return None

    async def on_slices_lost(self, slices: Slices) -> None:
        await self.on_slices_revoked(slices)


class ConsumerStopped(KeyrangeClientError):
    """The consumer is not started, or was stopped."""

    error = "CONSUMER_STOPPED"


class _Interrupted(Exception):
    """A waiting ``_next_item`` was asked to give up (``run()`` is stopping)."""


class KeyrangeConsumer:
    """Consume key-range slices of Kafka partitions, as a group member or standalone.

    With ``topics`` the consumer joins ``group_id`` through the coordinator and follows the
    assignment it gets; without topics call ``assign()`` to own slices directly (standalone:
    no membership, commits carry no member id and are accepted only while the group has no
    live members). ``aiokafka_kwargs`` go to ``AIOKafkaConsumer`` (``key_deserializer`` and
    ``value_deserializer`` are applied by Keyrange after hashing the raw key).

    ``commit_mode`` overrides what commits carry (``client.tracker``): ``"watermarks"`` (the
    default with individual commit), ``"ranges"`` (plain IC ranges, the KIP's baseline) or
    ``"offset"`` (classic offsets; the default with ``allow_individual_commit=False``).
    ``coordinator`` shares one ``CoordinatorClient`` between consumers; it is then not closed
    by ``stop()``.
    """

    def __init__(
        self,
        *topics: str,
        bootstrap_servers: str | Sequence[str],
        coordinator_url: str,
        group_id: str,
        token: str | None = None,
        assignor: str = "round-robin",
        allow_individual_commit: bool = True,
        session_timeout_ms: int = 10_000,
        max_num_ranges_to_commit: int = 10_000,
        auto_commit_interval_ms: int | None = 1_000,
        auto_offset_reset: str = "earliest",
        instance_id: str | None = None,
        client_id: str | None = None,
        rebalance_listener: RebalanceListener | None = None,
        revoke_timeout_s: float = 30.0,
        commit_mode: CommitMode | None = None,
        coordinator: CoordinatorClient | None = None,
        **aiokafka_kwargs: Any,
    ) -> None:
        if auto_offset_reset not in {"earliest", "latest"}:
            raise ValueError("auto_offset_reset must be 'earliest' or 'latest'")
        for reserved in ("group_id", "enable_auto_commit"):
            if reserved in aiokafka_kwargs:
                raise ValueError(f"{reserved} is managed by KeyrangeConsumer")
        self._topics = list(topics)
        self._group_id = group_id
        self._assignor = assignor
        self._allow_individual_commit = allow_individual_commit
        self._session_timeout_ms = session_timeout_ms
        self._max_ranges = max_num_ranges_to_commit
        self._auto_commit_s = (
            None if auto_commit_interval_ms is None else auto_commit_interval_ms / 1000
        )
        self._auto_offset_reset = auto_offset_reset
        self._instance_id = instance_id
        self._client_id = client_id
        self._listener = rebalance_listener or RebalanceListener()
        self._revoke_timeout_s = revoke_timeout_s
        self._key_deserializer: Callable[[bytes], Any] | None = aiokafka_kwargs.pop(
            "key_deserializer", None
        )
        self._value_deserializer: Callable[[bytes], Any] | None = aiokafka_kwargs.pop(
            "value_deserializer", None
        )
        self._kafka_kwargs = {
            "bootstrap_servers": bootstrap_servers,
            "auto_offset_reset": auto_offset_reset,
            **({} if client_id is None else {"client_id": client_id}),
            **aiokafka_kwargs,
        }
        self._owns_client = coordinator is None
        self._client = coordinator or CoordinatorClient(coordinator_url, token=token)
        mode: CommitMode = "watermarks" if allow_individual_commit else "offset"
        self._tracker = OffsetTracker(mode=commit_mode or mode)

        self._kafka: AIOKafkaConsumer | None = None
        self._kafka_lock = asyncio.Lock()
        self._commit_lock = asyncio.Lock()
        # Fetched records not handed out yet, in fetch order; never holds an exhausted run.
        self._buffer: deque[_Run] = deque()
        # Records given to user code and not marked yet: offset -> key hash per partition,
        # and, per partition in hand-out order, the batches ``getmany`` gave out whole, which
        # ``mark_all_processed`` can mark without a step per record (``_spread_batches``
        # moves them into the mapping when anything else needs to look them up).
        self._outstanding: dict[tuple[str, int], dict[int, int]] = {}
        self._outstanding_batches: dict[tuple[str, int], deque[_Run]] = {}
        self._last_auto: Record | None = None
        self._marked = asyncio.Event()
        self._draining = 0
        self._commit_soon: asyncio.Future[None] | None = None
        self._changed: asyncio.Future[None] | None = None
        self._dispatchers: set[_Dispatcher] = set()
        self._membership: Membership | None = None
        self._reconciler: Reconciler | None = None
        self._standalone_target: Slices | None = None
        self._auto_commit_task: asyncio.Task[None] | None = None
        self._started = False
        self._closed = False

    # ----------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> KeyrangeConsumer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        kafka = AIOKafkaConsumer(enable_auto_commit=False, **self._kafka_kwargs)
        try:
            await kafka.start()
        except BaseException:
            self._closed = True
            await kafka.stop()
            if self._owns_client:
                await self._client.aclose()
            raise
        self._kafka = kafka
        if self._topics:
            self._membership = Membership(
                self._client,
                self._group_id,
                self,
                topics=self._topics,
                assignor=self._assignor,
                allow_individual_commit=self._allow_individual_commit,
                session_timeout_ms=self._session_timeout_ms,
                instance_id=self._instance_id,
                client_id=self._client_id,
            )
            self._reconciler = self._membership.reconciler
            self._membership.failure.add_done_callback(lambda _: self._notify())
            self._membership.start()
        else:
            self._reconciler = Reconciler(self, _nothing)
            self._reconciler.start()
            if self._standalone_target is not None:
                self._reconciler.set_target(self._standalone_target)
        self._auto_commit_task = asyncio.create_task(
            self._auto_commit(self._auto_commit_s), name="keyrange-auto-commit"
        )

    async def stop(self) -> None:
        """Commit what was processed, leave the group and close every connection."""
        if self._closed or not self._started:
            self._closed = True
            return
        self._closed = True
        self._notify()
        try:
            # Bounded, so a handler that ignores cancellation or an unreachable coordinator
            # cannot hang shutdown: past the bound the session expiry frees the slices and
            # whatever was not committed is redelivered (at-least-once).
            async with asyncio.timeout(self._revoke_timeout_s + _CLOSE_GRACE_S):
                await self._finish_and_leave()
        except TimeoutError:
            logger.warning(
                "stop() exceeded its bound; closing without a final commit and leave",
                extra={"bound_s": self._revoke_timeout_s + _CLOSE_GRACE_S},
            )
        finally:
            if self._kafka is not None:
                async with self._kafka_lock:
                    await self._kafka.stop()
            if self._owns_client:
                await self._client.aclose()

    async def _finish_and_leave(self) -> None:
        for dispatcher in list(self._dispatchers):
            await dispatcher.finish(self._revoke_timeout_s)
        if self._auto_commit_task is not None:
            self._auto_commit_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._auto_commit_task
        if self._reconciler is not None:
            await self._reconciler.stop()
        await self._commit(raise_errors=False)
        held = self.owned_slices()
        if held:
            await self._call_listener(self._listener.on_slices_revoked, held)
        if self._membership is not None:
            await self._membership.leave()

    # ----------------------------------------------------------------- public API

    def assign(self, slices: Mapping[TopicPartition, Sequence[KeyRange]]) -> None:
        """Own exactly these slices (standalone mode); an empty list means the whole
        partition. Slices dropped by a later call are committed and released."""
        if self._topics:
            raise InvalidRequest("assign() is for standalone consumers created without topics")
        target = {
            tp: normalize(ranges) if ranges else [KeyRange.full()] for tp, ranges in slices.items()
        }
        self._standalone_target = target
        if self._reconciler is not None:
            self._reconciler.set_target(target)

    def assignment(self) -> Slices:
        """The slices whose records are handed out now."""
        return self._tracker.owned()

    async def wait_for_assignment(self) -> Slices:
        """Until the consumer owns what the coordinator (or ``assign``) currently grants."""
        self._check_running()
        if self._reconciler is None:
            raise ConsumerStopped("the consumer is not started")
        settled = asyncio.ensure_future(self._reconciler.wait_settled())
        try:
            await self._until(settled)
        finally:
            settled.cancel()
        return self.assignment()

    @property
    def member_id(self) -> str | None:
        return None if self._membership is None else self._membership.member_id

    @property
    def member_epoch(self) -> int | None:
        return None if self._membership is None else self._membership.member_epoch

    def __aiter__(self) -> AsyncIterator[Record]:
        return self.records()

    async def records(self, *, auto_mark: bool = True) -> AsyncIterator[Record]:
        """Records one at a time; with ``auto_mark`` each is marked processed when the next
        one is requested, so leaving the loop early leaves the last one unmarked."""
        while True:
            if auto_mark and self._last_auto is not None:
                self.mark_processed(self._last_auto)
                self._last_auto = None
            try:
                if self._closed or not self._buffer or not self._may_hand_out():
                    await self._until_buffered(None)
                tp, record, hashed = self._take_one()
            except ConsumerStopped:
                if self._closed:
                    return
                raise
            self._hand_out(tp, record, hashed)
            if auto_mark:
                self._last_auto = record
            yield record

    async def getmany(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[Record]]:
        """A batch by partition, like ``AIOKafkaConsumer.getmany``; mark each record with
        ``mark_processed`` once done."""
        deadline = time.monotonic() + timeout_ms / 1000
        batch: dict[TopicPartition, list[Record]] = {}
        if not self._buffer or not self._may_hand_out():
            try:
                await self._until_buffered(deadline)
            except TimeoutError:
                return batch
        remaining = (
            max_records
            if max_records is not None
            else sum(len(run.records) - run.next for run in self._buffer)
        )
        # Whole runs move as list slices: no Python step per record.
        handed: dict[TopicPartition, _Run] = {}
        while self._buffer and remaining > 0:
            run = self._buffer[0]
            start = run.next
            end = min(len(run.records), start + remaining)
            remaining -= end - start
            taken = handed.get(run.tp)
            if taken is None:
                handed[run.tp] = _Run(
                    run.tp, run.records[start:end], run.offsets[start:end], run.hashes[start:end]
                )
            else:
                taken.records += run.records[start:end]
                taken.offsets += run.offsets[start:end]
                taken.hashes += run.hashes[start:end]
            if end == len(run.records):
                self._buffer.popleft()
            else:
                run.next = end
        for tp, taken in handed.items():
            batches = self._outstanding_batches.get(tp)
            if batches is None:
                batches = self._outstanding_batches[tp] = deque()
            batches.append(taken)
            # The caller gets a list of its own; ours records what was handed out.
            batch[tp] = list(taken.records)
        return batch

    def mark_all_processed(self, records: Iterable[Record]) -> None:
        """``mark_processed`` for each of ``records``. The oldest unmarked ``getmany`` batch of
        a partition, processed in order, is marked in one step instead of one per record."""
        batch = records if isinstance(records, list) else list(records)
        if not batch:
            return
        first = batch[0]
        tp = (first.topic, first.partition)
        batches = self._outstanding_batches.get(tp)
        if batches:
            oldest = batches[0]
            if (
                len(oldest.records) == len(batch)
                and all(map(is_, batch, oldest.records))
                and self._tracker.mark_head(oldest.tp, oldest.offsets)
            ):
                batches.popleft()
                if self._draining:
                    self._marked.set()
                return
        for record in batch:
            self.mark_processed(record)

    def mark_processed(self, record: Record) -> None:
        """Count ``record`` as processed; marks of records no longer owned are ignored."""
        # A plain tuple finds TopicPartition keys (a NamedTuple) and is cheaper to build.
        tp = (record.topic, record.partition)
        if tp in self._outstanding_batches:
            self._spread_batches(tp)
        handed = self._outstanding.get(tp)
        if handed is None:
            return
        hashed = handed.pop(record.offset, None)
        if hashed is None:
            return
        self._tracker.mark_processed(tp, record.offset, hashed)
        if self._draining:
            self._marked.set()
        if self._tracker.uncommitted_ranges >= self._max_ranges:
            self._request_commit()

    def still_owned(self, record: Record) -> bool:
        """Whether ``record``, handed out and not marked yet, is still this consumer's to
        process: False once its slice was released after the revoke timeout or lost, and from
        the instant the session deadline passes. Ask it right before a side effect (it costs
        a clock read and a lookup); what it cannot cover, a handler frozen between asking and
        acting, needs a fence downstream (docs/membership.md, "Zombie members")."""
        if not self._may_hand_out():
            return False
        tp = (record.topic, record.partition)
        handed = self._outstanding.get(tp)
        if handed is not None and record.offset in handed:
            return True
        return any(run.holds(record.offset) for run in self._outstanding_batches.get(tp, ()))

    async def commit(self) -> None:
        """Commit everything marked so far, now."""
        self._check_running()
        await self._commit(raise_errors=True)

    async def run(
        self, handler: Handler, *, max_concurrency: int = 1, cancel_on_loss: bool = True
    ) -> None:
        """Process records with ``handler`` until ``stop()``: different keys concurrently (up
        to ``max_concurrency`` handlers at once), each key one record at a time in offset
        order; a record is marked when its handler returns. A handler error stops the run
        (its record stays unprocessed) and is raised here.

        When the membership is lost (session deadline passed, fenced), handlers still running
        are cancelled, because their keys may already be another member's; their records are
        not marked and go to the slices' next owner. ``cancel_on_loss=False`` lets them run
        to their end instead (their outcome is still not committed)."""
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        dispatcher = _Dispatcher(self, handler, max_concurrency, cancel_on_loss=cancel_on_loss)
        self._dispatchers.add(dispatcher)
        try:
            await dispatcher.run()
        finally:
            self._dispatchers.discard(dispatcher)

    # ----------------------------------------------------------------- SliceOwner

    def owned_slices(self) -> Slices:
        owned: Slices = {}
        for tp in self._tracker.partitions():
            owned[tp] = normalize(progress.keys for progress in self._tracker.slices_of(tp))
        return owned

    def active_slices(self) -> Slices:
        return self._tracker.owned()

    async def acquire(self, added: Slices) -> None:
        kafka = self._running_kafka()
        topics = sorted({tp.topic for tp in added})
        committed = await self._client.fetch_offsets(self._group_id, topics)
        fresh = [tp for tp in added if tp not in committed]
        starts: dict[TopicPartition, int] = {}
        if fresh:
            if self._auto_offset_reset == "earliest":
                starts = await kafka.beginning_offsets(fresh)
            else:
                starts = await kafka.end_offsets(fresh)
        async with self._kafka_lock:
            for tp, ranges in added.items():
                state = committed.get(tp)
                for keys in normalize(ranges):
                    position = state.min_watermark(keys) if state is not None else starts[tp]
                    self._tracker.add_slice(tp, keys, position=position, committed=state)
            self._sync_kafka(kafka, seek=added)
        logger.info(
            "slices assigned",
            extra={"group_id": self._group_id, "slices": _describe(added)},
        )
        self._notify()
        await self._call_listener(self._listener.on_slices_assigned, added)

    async def release(self, revoked: Slices) -> None:
        async with self._kafka_lock:
            for tp, ranges in revoked.items():
                self._tracker.deactivate(tp, ranges)
            self._withdraw(revoked)
        await self._drain(revoked)
        await self._commit(raise_errors=False)
        await self._call_listener(self._listener.on_slices_revoked, revoked)
        async with self._kafka_lock:
            self._tracker.remove_inactive()
            self._forget_outstanding(revoked)
            self._sync_kafka(self._running_kafka(), seek={})
        logger.info(
            "slices released",
            extra={"group_id": self._group_id, "slices": _describe(revoked)},
        )

    def withhold(self) -> None:
        # Synchronous on purpose: it runs the instant the loss is known, before any other task
        # of this loop can hand a buffered or queued record to user code.
        self._buffer.clear()
        self._last_auto = None
        for dispatcher in self._dispatchers:
            dispatcher.lose()

    async def lose_all(self) -> None:
        async with self._kafka_lock:
            lost = self._tracker.clear()
            self.withhold()
            self._outstanding.clear()
            self._outstanding_batches.clear()
            self._sync_kafka(self._running_kafka(), seek={})
        if lost:
            logger.warning(
                "slices lost", extra={"group_id": self._group_id, "slices": _describe(lost)}
            )
            await self._call_listener(self._listener.on_slices_lost, lost)

    # ----------------------------------------------------------------- fetching

    async def _next_item(
        self, deadline: float | None, interrupt: asyncio.Future[None] | None = None
    ) -> _Item:
        """The next record to hand out, waiting as ``_until_buffered`` does."""
        await self._until_buffered(deadline, interrupt)
        return self._take_one()

    def _take_one(self) -> _Item:
        run = self._buffer[0]
        index = run.next
        run.next = index + 1
        if run.next == len(run.records):
            self._buffer.popleft()
        return run.tp, run.records[index], run.hashes[index]

    async def _until_buffered(
        self, deadline: float | None, interrupt: asyncio.Future[None] | None = None
    ) -> None:
        """Fetch until a record is ready to hand out; TimeoutError at ``deadline`` (after at
        least one poll), ``_Interrupted`` once ``interrupt`` is done."""
        polled = False
        while True:
            self._check_running()
            if interrupt is not None and interrupt.done():
                raise _Interrupted
            lost = not self._may_hand_out()
            if self._buffer and not lost:
                return
            remaining = None if deadline is None else deadline - time.monotonic()
            if polled and remaining is not None and remaining <= 0:
                raise TimeoutError
            kafka = self._running_kafka()
            if lost or not kafka.assignment():
                # Lost: nothing to hand out until the member rejoined and acquired slices.
                waits: set[asyncio.Future[None]] = {self._change_future()}
                if interrupt is not None:
                    waits.add(interrupt)
                await asyncio.wait(
                    waits,
                    timeout=None if remaining is None else max(remaining, 0),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                polled = True
                continue
            polled = True
            poll = _POLL_SLICE_S if remaining is None else max(min(remaining, _POLL_SLICE_S), 0)
            async with self._kafka_lock:
                batches = await kafka.getmany(timeout_ms=int(poll * 1000))
                if not self._may_hand_out():
                    # Lost during the poll: these records belong to slices no longer ours.
                    continue
                for tp, records in batches.items():
                    self._examine(tp, records)

    def _examine(self, tp: TopicPartition, records: Sequence[Record]) -> None:
        """Hot path: keep our unprocessed records, count every record as seen."""
        if not records:
            return
        active = [progress for progress in self._tracker.slices_of(tp) if progress.active]
        in_bulk = (
            len(active) == 1
            and self._key_deserializer is None
            and self._value_deserializer is None
            and self._examine_run(tp, records, active[0])
        )
        if active and not in_bulk:
            accept: Callable[[TopicPartition, int, int], bool]
            if len(active) == 1:
                # The usual case, one slice per partition: the range check inlined.
                only = active[0]
                low, high, accept_own = only.keys.start, only.keys.end, only.accept

                def accept_one(_: TopicPartition, offset: int, hashed: int) -> bool:
                    return low <= hashed <= high and accept_own(offset, hashed)

                accept = accept_one
            else:
                accept = self._tracker.accept
            digest = murmur3_halves  # ``key_hash`` inlined for keyed records
            key_decode, value_decode = self._key_deserializer, self._value_deserializer
            kept: list[Record] = []
            kept_offsets: list[int] = []
            kept_hashes: list[int] = []
            for record in records:
                key = record.key
                offset = record.offset
                hashed = key_hash(None, offset) if key is None else digest(key, 0)[0] >> 1
                if accept(tp, offset, hashed):
                    if key_decode is not None or value_decode is not None:
                        record = _decoded(record, key_decode, value_decode)
                    kept.append(record)
                    kept_offsets.append(offset)
                    kept_hashes.append(hashed)
            if kept:
                self._buffer.append(_Run(tp, kept, kept_offsets, kept_hashes))
        self._tracker.advance(tp, records[-1].offset + 1)

    def _examine_run(
        self, tp: TopicPartition, records: Sequence[Record], only: SliceProgress
    ) -> bool:
        """The common case in bulk: one owned slice, nothing to deserialise, and a fetch that
        lies wholly past what the slice has seen and what the group committed. Each step is
        one comprehension or one C-level extend instead of Python calls per record."""
        digest = murmur3_halves  # ``key_hash`` inlined for keyed records
        hashes = [
            digest(record.key, 0)[0] >> 1
            if record.key is not None
            else key_hash(None, record.offset)
            for record in records
        ]
        low, high = only.keys.start, only.keys.end
        kept: list[Record]
        if low == HASH_MIN and high == HASH_MAX:
            kept, kept_hashes = list(records), hashes
        else:
            inside = [low <= hashed <= high for hashed in hashes]
            kept = list(compress(records, inside))
            if not kept:
                return True
            kept_hashes = list(compress(hashes, inside))
        offsets = [record.offset for record in kept]
        if not only.accept_run(offsets, kept_hashes):
            return False
        self._buffer.append(_Run(tp, kept, offsets, kept_hashes))
        return True

    def _hand_out(self, tp: TopicPartition, record: Record, hashed: int) -> None:
        handed = self._outstanding.get(tp)
        if handed is None:
            handed = self._outstanding[tp] = {}
        handed[record.offset] = hashed

    def _sync_kafka(self, kafka: AIOKafkaConsumer, seek: Mapping[TopicPartition, object]) -> None:
        """Assign Kafka the partitions of active slices; (re)start reading where each
        slice needs it. Called with the fetch lock held."""
        wanted = set(self._tracker.owned())
        reassign = wanted != set(kafka.assignment())
        if reassign:
            kafka.assign(sorted(wanted))
        for tp in sorted(wanted):
            if reassign or tp in seek:
                position = self._tracker.read_position(tp)
                if position is not None:
                    kafka.seek(tp, position)

    def _withdraw(self, slices: Slices) -> None:
        """Take records of ``slices`` that were not handed out yet back from delivery."""
        kept_runs: deque[_Run] = deque()
        for run in self._buffer:
            left = run.hashes[run.next :]
            keep = [not _in_slices(slices, run.tp, hashed) for hashed in left]
            records = list(compress(run.records[run.next :], keep))
            if records:
                offsets = list(compress(run.offsets[run.next :], keep))
                kept_runs.append(_Run(run.tp, records, offsets, list(compress(left, keep))))
        self._buffer = kept_runs
        for dispatcher in self._dispatchers:
            dispatcher.withdraw(slices)

    def _spread_batches(self, tp: tuple[str, int]) -> None:
        """Move the partition's outstanding ``getmany`` batches into the per-record mapping."""
        batches = self._outstanding_batches.pop(tp, None)
        if not batches:
            return
        handed = self._outstanding.get(tp)
        if handed is None:
            handed = self._outstanding[tp] = {}
        for run in batches:
            handed.update(zip(run.offsets, run.hashes, strict=True))

    def _forget_outstanding(self, slices: Slices) -> None:
        for tp, ranges in slices.items():
            self._spread_batches(tp)
            handed = self._outstanding.get(tp)
            if not handed:
                continue
            for offset in [o for o, h in handed.items() if any(r.contains(h) for r in ranges)]:
                del handed[offset]

    async def _drain(self, slices: Slices) -> None:
        """Until no record of ``slices`` is with user code, or the revoke timeout."""
        deadline = time.monotonic() + self._revoke_timeout_s
        self._draining += 1
        try:
            while self._outstanding_in(slices):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    logger.warning(
                        "revoke timeout: releasing slices with records still in processing",
                        extra={"group_id": self._group_id, "slices": _describe(slices)},
                    )
                    return
                self._marked.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._marked.wait(), remaining)
        finally:
            self._draining -= 1

    def _outstanding_in(self, slices: Slices) -> bool:
        for tp, ranges in slices.items():
            self._spread_batches(tp)
            for hashed in self._outstanding.get(tp, {}).values():
                if any(r.contains(hashed) for r in ranges):
                    return True
        return False

    # ----------------------------------------------------------------- committing

    async def _auto_commit(self, interval_s: float | None) -> None:
        """Commit every ``interval_s`` (never, with None) and whenever the uncommitted ranges
        reach ``max_num_ranges_to_commit``, which applies even without periodic commits."""
        next_at = None if interval_s is None else time.monotonic() + interval_s
        while True:
            self._commit_soon = asyncio.get_running_loop().create_future()
            timeout = None if next_at is None else max(next_at - time.monotonic(), 0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._commit_soon), timeout)
            if interval_s is not None:
                next_at = time.monotonic() + interval_s
            await self._commit(raise_errors=False)

    def _request_commit(self) -> None:
        if self._commit_soon is not None and not self._commit_soon.done():
            self._commit_soon.set_result(None)

    async def _commit(self, *, raise_errors: bool) -> None:
        async with self._commit_lock:
            try:
                await self._commit_locked()
            except KeyrangeClientError as error:
                if raise_errors:
                    raise
                logger.warning(
                    "commit failed; progress is kept for the next commit",
                    extra={"group_id": self._group_id, "error": str(error)},
                )

    async def _commit_locked(self) -> None:
        refreshed = False
        while True:
            batch = self._tracker.prepare_commit(max_ranges=_MAX_RANGES_PER_REQUEST)
            if batch is None:
                return
            if not self._may_hand_out():
                raise UnknownMemberId("the session was lost; nothing committed")
            member_id, member_epoch = (
                (None, None) if self._membership is None else self._membership.identity()
            )
            if self._membership is not None and member_id is None:
                raise UnknownMemberId("not a member of the group (joining); nothing committed")
            try:
                replies = await self._client.commit(
                    self._group_id,
                    batch.partitions,
                    member_id=member_id,
                    member_epoch=member_epoch,
                )
            except IndividualCommitNotAllowed:
                # The coordinator runs with accept.individual.commit off: whole partitions
                # can still commit a classic offset (their lowest unprocessed record).
                if self._tracker.mode == "offset":
                    raise
                logger.warning(
                    "the coordinator refuses individual commits; committing classic offsets",
                    extra={"group_id": self._group_id},
                )
                self._tracker.mode = "offset"
                continue
            except FencedMemberEpoch:
                # The epoch moved on (an assignment change); refresh it once and retry the
                # slices still held. A second fence means the slices are gone.
                if self._membership is None or refreshed:
                    raise
                refreshed = True
                if not await self._membership.refresh():
                    raise
                continue
            for refused in self._tracker.commit_succeeded(batch, replies):
                logger.warning(
                    "commit refused for a partition",
                    extra={
                        "group_id": self._group_id,
                        "topic": refused.topic,
                        "partition": refused.partition,
                        "error": refused.error,
                    },
                )
            return

    # ----------------------------------------------------------------- helpers

    def _running_kafka(self) -> AIOKafkaConsumer:
        if self._kafka is None:
            raise ConsumerStopped("the consumer is not started")
        return self._kafka

    def _check_running(self) -> None:
        if self._closed or not self._started:
            raise ConsumerStopped("the consumer is not running")
        if self._membership is not None and self._membership.failure.done():
            self._membership.failure.result()

    def _may_hand_out(self) -> bool:
        """The guard before every hand-out (DESIGN §5, the client half of the safety
        invariant); asking it is what notices a session deadline passed during a freeze."""
        return self._membership is None or not self._membership.session_lost()

    def _change_future(self) -> asyncio.Future[None]:
        if self._changed is None or self._changed.done():
            self._changed = asyncio.get_running_loop().create_future()
        return self._changed

    def _notify(self) -> None:
        """Wake waiters for an assignment: it changed, failed, or the consumer stops."""
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)

    async def _until(self, awaitable: asyncio.Future[None]) -> None:
        while not awaitable.done():
            self._check_running()
            await asyncio.wait(
                {awaitable, self._change_future()}, return_when=asyncio.FIRST_COMPLETED
            )
        awaitable.result()

    async def _call_listener(
        self, callback: Callable[[Slices], Awaitable[None]], slices: Slices
    ) -> None:
        try:
            await callback(slices)
        except Exception:
            logger.exception(
                "rebalance listener failed",
                extra={"group_id": self._group_id, "callback": callback.__name__},
            )


class _Run:
    """Fetched records of one partition to hand out, in offset order, with their offsets and
    key hashes; ``next`` is the first not handed out. Whole fetches are buffered this way
    because a tuple per record kept the garbage collector busy."""

    __slots__ = ("hashes", "next", "offsets", "records", "tp")

    def __init__(
        self, tp: TopicPartition, records: list[Record], offsets: list[int], hashes: list[int]
    ) -> None:
        self.tp = tp
        self.records = records
        self.offsets = offsets
        self.hashes = hashes
        self.next = 0

    def holds(self, offset: int) -> bool:
        index = bisect.bisect_left(self.offsets, offset)
        return index < len(self.offsets) and self.offsets[index] == offset


class _Dispatcher:
    """``run()``'s machinery: one chain of records per (partition, key hash) and a fixed pool
    of ``max_concurrency`` workers. A chain is scheduled at most once at any time, so a key's
    records run one at a time in offset order; a worker takes one record of a chain and puts
    the chain back at the end of the ready queue, so hot keys do not starve the others."""

    # Records dispatched but not finished, per worker: enough to keep every worker busy
    # across hot keys without reading the whole partition into memory.
    _QUEUED_PER_WORKER = 64

    def __init__(
        self,
        consumer: KeyrangeConsumer,
        handler: Handler,
        max_concurrency: int,
        *,
        cancel_on_loss: bool,
    ) -> None:
        self._consumer = consumer
        self._handler = handler
        self._workers = max_concurrency
        self._cancel_on_loss = cancel_on_loss
        self._max_queued = max_concurrency * self._QUEUED_PER_WORKER
        self._chains: dict[tuple[TopicPartition, int], deque[_Item]] = {}
        self._ready: asyncio.Queue[tuple[TopicPartition, int] | None] = asyncio.Queue()
        # The worker task running each chain's head, and the chains whose handler was
        # cancelled because the membership was lost.
        self._running: dict[tuple[TopicPartition, int], asyncio.Task[Any]] = {}
        self._cancelled: set[tuple[TopicPartition, int]] = set()
        self._queued = 0
        self._space = asyncio.Event()
        self._space.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stopping = False

    async def run(self) -> None:
        consumer = self._consumer
        for index in range(self._workers):
            task = asyncio.create_task(self._work(), name=f"keyrange-worker-{index}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            while not self._stopping:
                try:
                    item = await consumer._next_item(None, self._failure)
                except _Interrupted:
                    break
                except ConsumerStopped:
                    if consumer._closed:
                        break
                    raise
                self._dispatch(item)
                while self._queued >= self._max_queued and not self._failure.done():
                    self._space.clear()
                    space = asyncio.ensure_future(self._space.wait())
                    waits: set[asyncio.Future[Any]] = {space, self._failure}
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    space.cancel()
        finally:
            await self.finish(None)
        if self._failure.done():
            self._failure.result()

    def _dispatch(self, item: _Item) -> None:
        tp, _, hashed = item
        ident = (tp, hashed)
        self._queued += 1
        chain = self._chains.get(ident)
        if chain is not None:
            chain.append(item)
            return
        self._chains[ident] = deque([item])
        self._ready.put_nowait(ident)

    async def _work(self) -> None:
        chains, ready = self._chains, self._ready
        worker = asyncio.current_task()
        assert worker is not None
        while True:
            ident = await ready.get()
            if ident is None or self._failure.done():
                return
            chain = chains[ident]
            # Asked before every hand-out. A lost membership withdrew every queued record
            # before the answer turned False, so the chain is empty then.
            if not chain or not self._consumer._may_hand_out():
                self._done(len(chain))
                del chains[ident]
                continue
            tp, record, hashed = chain[0]
            self._consumer._hand_out(tp, record, hashed)
            self._running[ident] = worker
            try:
                await self._handler(record)
            except asyncio.CancelledError:
                if ident not in self._cancelled or worker.uncancel() > 0:
                    raise
            except Exception as error:
                if not self._failure.done():
                    self._failure.set_exception(error)
                return
            finally:
                del self._running[ident]
            chain.popleft()
            self._done(1)
            if ident in self._cancelled:
                # Cancelled for a lost membership (or it swallowed the cancellation): the
                # key may be another member's already, so the record is not marked.
                self._cancelled.discard(ident)
                if worker.cancelling():
                    worker.uncancel()
            else:
                self._consumer.mark_processed(record)
            if chain:
                ready.put_nowait(ident)
            else:
                del chains[ident]

    def _done(self, count: int) -> None:
        self._queued -= count
        if self._queued < self._max_queued:
            self._space.set()

    def lose(self) -> None:
        """The membership is lost: drop every queued record and cancel the handlers still
        running (unless ``cancel_on_loss`` is off), since their keys may be another member's
        already."""
        self.withdraw(None)
        if not self._cancel_on_loss:
            return
        for ident, worker in self._running.items():
            if ident not in self._cancelled:
                self._cancelled.add(ident)
                worker.cancel()

    def withdraw(self, slices: Slices | None) -> None:
        """Drop queued records of ``slices`` (all with None) that no handler started."""
        for (tp, hashed), chain in self._chains.items():
            if slices is not None and not _in_slices(slices, tp, hashed):
                continue
            keep = 1 if (tp, hashed) in self._running else 0
            dropped = len(chain) - keep
            if dropped > 0:
                for _ in range(dropped):
                    chain.pop()
                self._done(dropped)

    async def finish(self, timeout_s: float | None) -> None:
        """Stop dispatching; let started handlers end (up to ``timeout_s``), drop the rest."""
        self._stopping = True
        self.withdraw(None)
        if not self._failure.done():
            self._failure.set_result(None)
        for _ in range(self._workers):
            self._ready.put_nowait(None)
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=timeout_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)


def _nothing() -> None:
    return None


def _in_slices(slices: Slices, tp: TopicPartition, hashed: int) -> bool:
    ranges = slices.get(tp)
    return ranges is not None and any(r.contains(hashed) for r in ranges)


def _decoded(
    record: Record,
    key_decode: Callable[[bytes], Any] | None,
    value_decode: Callable[[bytes], Any] | None,
) -> Record:
    key, value = record.key, record.value
    return dataclasses.replace(
        record,
        key=key if key is None or key_decode is None else key_decode(key),
        value=value if value is None or value_decode is None else value_decode(value),
    )


def _describe(slices: Slices) -> list[str]:
    return [
        f"{tp.topic}[{tp.partition}]{[str(r) for r in ranges]}" for tp, ranges in slices.items()
    ]
