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
heartbeat learns what the coordinator did meanwhile (docs/design.md §5, docs/membership.md).

Delivery is at least once. A record counts as processed when it is marked: ``async for``
marks the previous record when the next one is requested (unless ``auto_mark=False``),
``getmany`` leaves marking to the caller, ``run`` marks after the handler returns.

The consumer is a front over parts, one job each: ``client.fetcher`` reads Kafka and keeps
what may be handed out, ``client.handout`` tracks what user code holds (and drains it before a
revoke), ``client.committer`` commits, ``client.dispatch`` is ``run()``'s worker pool,
``client.release`` gives slices up, ``client.membership`` heartbeats and reconciles, and
``client.status`` holds where the consumer stands and the hand-out guard, which the parts
ask instead of the front. The front owns the public API, the order of the lifecycle's steps
and the slice changes reconciliation asks for; ``drive`` builds the seams a runtime uses
(``client.consumer_source``) from the parts.

Concerns and their tasks: the Kafka fetch runs in the caller's ``async for``/``getmany``
(aiokafka prefetches in its own task), periodic commits in one task, and in group mode the
heartbeat and the reconciliation in one task each (``client.membership``). ``stop`` shuts
them down in a fixed order: reconciliation, final commit, leave the group, Kafka, HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, cast

from aiokafka.structs import TopicPartition

from client.committer import Committer
from client.consumer_source import ConsumerSource
from client.dispatch import Dispatcher, Handler
from client.errors import ConsumerStopped, InvalidRequest, NoOffsetForPartition
from client.fetcher import Fetcher, OutsideLog, Record
from client.handout import HandedOut
from client.http import CoordinatorClient, Slices, StuckCall
from client.log_reset import OutsideLogReset
from client.membership import Membership, Reconciler
from client.protocol.keyspace import KeyRange, normalize
from client.protocol.log_bounds import OFFSET_RESETS, OffsetReset
from client.release import SliceRelease, describe
from client.runtime.gate import OwnershipGate, Running
from client.runtime.seams import Runtime
from client.status import ConsumerStatus
from client.tracing import record_tracer
from client.tracker import CommitMode, OffsetTracker

__all__ = ["ConsumerStopped", "Handler", "KeyrangeConsumer", "RebalanceListener", "Record"]

logger = logging.getLogger(__name__)

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


# Over 300 lines, and earned: this is the public front, shaped like aiokafka's consumer, so its
# size is its API surface (constructor, life cycle, subscribe/assign, three ways to consume,
# commit, position and seek, the loss guards). Every method delegates to a part (fetcher,
# handout, committer, dispatch, membership) after checking the consumer's state; the longest
# method is the constructor, which validates the options and builds the parts.
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

    ``start()`` waits up to ``coordinator_start_timeout_ms`` for the coordinator to answer and
    then raises ``CoordinatorUnavailable`` naming the URL, so a wrong ``coordinator_url`` fails
    fast. ``auto_offset_reset`` (``earliest``, ``latest`` or ``none``) applies to partitions
    the group never committed and to a position outside the partition's log
    (``client.log_reset``).
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
        coordinator_start_timeout_ms: int = 60_000,
        **aiokafka_kwargs: Any,
    ) -> None:
        if auto_offset_reset not in OFFSET_RESETS:
            raise ValueError("auto_offset_reset must be 'earliest', 'latest' or 'none'")
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
        self._auto_offset_reset = cast(OffsetReset, auto_offset_reset)
        self._instance_id = instance_id
        # Shown beside the member in the admin API, the CLI and the console: by default one
        # that finds the process (host and pid), as "-" found nothing.
        self._client_id = client_id if client_id is not None else default_client_id()
        self._listener = rebalance_listener or RebalanceListener()
        self._revoke_timeout_s = revoke_timeout_s
        self._coordinator_start_timeout_s = coordinator_start_timeout_ms / 1000
        key_deserializer: Callable[[bytes], Any] | None = aiokafka_kwargs.pop(
            "key_deserializer", None
        )
        value_deserializer: Callable[[bytes], Any] | None = aiokafka_kwargs.pop(
            "value_deserializer", None
        )
        kafka_kwargs = {
            "bootstrap_servers": bootstrap_servers,
            **({} if client_id is None else {"client_id": client_id}),
            **aiokafka_kwargs,
        }
        self._owns_client = coordinator is None
        self._client = coordinator or CoordinatorClient(coordinator_url, token=token)
        mode: CommitMode = "watermarks" if allow_individual_commit else "offset"
        self._tracker = OffsetTracker(mode=commit_mode or mode)
        self._status = ConsumerStatus()
        self._fetcher = Fetcher(
            self._tracker,
            kafka_kwargs,
            key_deserializer=key_deserializer,
            value_deserializer=value_deserializer,
            status=self._status,
            on_outside_log=self._reset_outside_log,
        )
        self._outside_log_reset = OutsideLogReset(
            self._client,
            group_id,
            self._tracker,
            self._fetcher,
            self._auto_offset_reset,
            identity=self._status.identity,
            withdraw=self._withdraw,
        )
        self._handed = HandedOut()
        # Asked by every runtime right before user code starts a record (docs/design.md §5).
        self._gate = OwnershipGate(self._status.session_deadline)
        self._committer = Committer(
            self._client, group_id, self._tracker, may_commit=self._status.may_hand_out
        )
        self._last_auto: Record | None = None
        self._dispatchers: set[Runtime] = set()
        self._releasing = SliceRelease(
            group_id,
            self._tracker,
            self._fetcher,
            self._handed,
            self._gate,
            self._committer,
            runtimes=self._dispatchers,
            withdraw=self._withdraw,
            revoked_listener=self._revoked_listener,
            wake=self._wake_membership,
            revoke_timeout_s=revoke_timeout_s,
        )
        self._membership: Membership | None = None
        self._reconciler: Reconciler | None = None
        self._standalone_target: Slices | None = None

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
        if self._status.started:
            return
        self._status.started = True
        try:
            limits = await self._client.wait_until_reachable(self._coordinator_start_timeout_s)
            self._committer.learn(limits)
            await self._fetcher.start()
        except BaseException:
            self._status.stopped = True
            if self._owns_client:
                await self._client.aclose()
            raise
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
            self._committer.membership = self._status.membership = self._membership
            self._reconciler = self._membership.reconciler
            self._membership.failure.add_done_callback(lambda _: self._status.notify())
            self._membership.start()
        else:
            self._reconciler = Reconciler(self, _nothing)
            self._reconciler.start()
            if self._standalone_target is not None:
                self._reconciler.set_target(self._standalone_target)
        self._committer.start(self._auto_commit_s)

    async def stop(self) -> None:
        """Let what runs finish, commit what was processed, leave the group and close every
        connection.

        Nothing starts in user code once this is called. Records in processing get
        ``revoke_timeout_s``; then calls that can be stopped are (cancelled, their process
        killed) and those that cannot, on threads, hold the leave: the member goes on
        heartbeating, so their keys stay here until they end (docs/design.md §5). A second signal or
        a kill ends the process, and the calls with it, for an operator who will not wait.
        """
        if self._status.stopped or not self._status.started:
            self._status.stopped = True
            return
        self._status.stopped = True
        self._gate.close()
        self._status.notify()
        try:
            if self._reconciler is not None:
                await self._reconciler.stop()
            self._releasing.cancel_holds()
            try:
                # Bounded, so a runtime whose shutdown hangs cannot hang this one.
                async with asyncio.timeout(self._revoke_timeout_s + _CLOSE_GRACE_S):
                    for runtime in list(self._dispatchers):
                        await runtime.finish(self._revoke_timeout_s)
            except TimeoutError:
                logger.warning(
                    "the processing runtime did not finish in time",
                    extra={"group_id": self._group_id, "bound_s": self._revoke_timeout_s},
                )
            await self._releasing.hold(None)
            try:
                async with asyncio.timeout(_CLOSE_GRACE_S):
                    await self._commit_and_leave()
            except TimeoutError:
                logger.warning(
                    "stop() exceeded its bound; closing without a final commit and leave",
                    extra={"bound_s": _CLOSE_GRACE_S},
                )
        finally:
            await self._fetcher.stop()
            if self._owns_client:
                await self._client.aclose()

    async def _commit_and_leave(self) -> None:
        await self._committer.stop()
        await self._committer.commit(raise_errors=False)
        held = self.owned_slices()
        if held:
            await self._call_listener(self._listener.on_slices_revoked, held)
        self._gate.end()
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
        self._status.check_running()
        if self._reconciler is None:
            raise ConsumerStopped("the consumer is not started")
        settled = asyncio.ensure_future(self._reconciler.wait_settled())
        try:
            await self._until(settled)
        finally:
            settled.cancel()
        return self.assignment()

    @property
    def gate(self) -> OwnershipGate:
        """Asked by every runtime right before user code starts a record (docs/design.md §5)."""
        return self._gate

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
                if (
                    self._status.stopped
                    or not self._fetcher.buffered
                    or not self._status.may_hand_out()
                ):
                    await self._fetcher.until_buffered(None)
                tp, record, hashed = self._fetcher.take_one()
            except ConsumerStopped:
                if self._status.stopped:
                    return
                raise
            self._handed.hand_out(tp, record.offset, hashed)
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
        if not self._fetcher.buffered or not self._status.may_hand_out():
            try:
                await self._fetcher.until_buffered(deadline)
            except TimeoutError:
                return batch
        for tp, taken in self._fetcher.take_batch(max_records).items():
            self._handed.hand_out_batch(taken)
            # The caller gets a list of its own; ours records what was handed out.
            batch[tp] = list(taken.records)
        return batch

    def mark_all_processed(self, records: Iterable[Record]) -> None:
        """``mark_processed`` for each of ``records``. The oldest unmarked ``getmany`` batch of
        a partition, processed in order, is marked in one step instead of one per record."""
        batch = records if isinstance(records, list) else list(records)
        if not batch:
            return
        if self._handed.take_oldest_batch(batch, self._tracker.mark_head):
            return
        for record in batch:
            self.mark_processed(record)

    def mark_processed(self, record: Record) -> None:
        """Count ``record`` as processed; marks of records no longer owned are ignored."""
        hashed = self._handed.take(record)
        if hashed is None:
            return
        # A plain tuple finds TopicPartition keys (a NamedTuple) and is cheaper to build.
        self._tracker.mark_processed((record.topic, record.partition), record.offset, hashed)
        if self._tracker.uncommitted_ranges >= self._max_ranges:
            self._committer.request()

    def still_owned(self, record: Record) -> bool:
        """Whether ``record``, handed out and not marked yet, is still this consumer's to
        process: False once its slice was released after the revoke timeout or lost, and from
        the instant the session deadline passes. Ask it right before a side effect (it costs
        a clock read and a lookup); what it cannot cover, a handler frozen between asking and
        acting, needs a fence downstream (docs/membership.md, "Zombie members")."""
        return self._status.may_hand_out() and self._handed.holds(record)

    async def commit(self) -> None:
        """Commit everything marked so far, now."""
        self._status.check_running()
        await self._committer.commit(raise_errors=True)

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
        await self.drive(
            lambda source: Dispatcher(
                source,
                handler,
                max_concurrency,
                cancel_on_loss=cancel_on_loss,
                tracer=record_tracer("run", self._group_id, lambda: self.member_id),
            )
        )

    async def drive(self, make_runtime: Callable[[ConsumerSource], Runtime]) -> None:
        """Run a processing runtime over this consumer's records until ``stop()``: what
        ``run`` does with its dispatcher, open to other runtimes (``client.worker``). The
        runtime is told of revocations, losses and the stop as ``run``'s dispatcher is."""
        source = ConsumerSource(
            self._fetcher,
            self._handed,
            self._tracker,
            self._gate,
            self._status,
            mark_processed=self.mark_processed,
        )
        runtime = make_runtime(source)
        self._dispatchers.add(runtime)
        try:
            await runtime.run()
        finally:
            self._dispatchers.discard(runtime)

    # ----------------------------------------------------------------- SliceOwner

    def owned_slices(self) -> Slices:
        owned: Slices = {}
        for tp in self._tracker.partitions():
            owned[tp] = normalize(progress.keys for progress in self._tracker.slices_of(tp))
        return owned

    def active_slices(self) -> Slices:
        return self._tracker.owned()

    async def acquire(self, added: Slices) -> None:
        self._fetcher.kafka()
        topics = sorted({tp.topic for tp in added})
        committed = await self._client.fetch_offsets(self._group_id, topics)
        fresh = [tp for tp in added if tp not in committed]
        if fresh and self._auto_offset_reset == "none":
            self._status.failure = NoOffsetForPartition(
                f"group '{self._group_id}' has no committed offset for "
                f"{', '.join(f'{tp.topic}[{tp.partition}]' for tp in sorted(fresh))} and "
                "auto_offset_reset is 'none'"
            )
            self._status.notify()
            raise self._status.failure
        starts = await self._fetcher.start_positions(fresh, self._auto_offset_reset)
        async with self._fetcher.lock:
            # Keys kept for a call that could not be stopped, granted back: ours again; the
            # runtime runs the key's next record only after that call (one chain per key).
            self._tracker.remove_inactive(added)
            self._releasing.granted_again(added)
            for tp, ranges in added.items():
                state = committed.get(tp)
                for keys in normalize(ranges):
                    position = state.min_watermark(keys) if state is not None else starts[tp]
                    self._tracker.add_slice(tp, keys, position=position, committed=state)
            self._gate.grant(added)
            self._fetcher.sync(seek=added)
        logger.info(
            "slices assigned",
            extra={"group_id": self._group_id, "slices": describe(added)},
        )
        self._status.notify()
        await self._call_listener(self._listener.on_slices_assigned, added)

    async def release(self, revoked: Slices) -> None:
        await self._releasing.release(revoked)

    def stuck_report(self) -> list[StuckCall]:
        return self._releasing.stuck_report()

    def stuck_calls(self) -> list[Running]:
        """Calls that cannot be stopped, holding keys of slices this member gave up (or the
        leave): for metrics and for the coordinator to show."""
        return self._releasing.stuck_calls()

    def withhold(self) -> None:
        # Synchronous on purpose: it runs the instant the loss is known, before any other task
        # of this loop can hand a buffered or queued record to user code.
        self._gate.end()
        self._fetcher.clear()
        self._last_auto = None
        for dispatcher in self._dispatchers:
            dispatcher.lose()

    async def lose_all(self) -> None:
        async with self._fetcher.lock:
            lost = self._tracker.clear()
            self.withhold()
            self._handed.clear()
            self._releasing.clear()
            self._fetcher.sync(seek={})
        if lost:
            logger.warning(
                "slices lost", extra={"group_id": self._group_id, "slices": describe(lost)}
            )
            await self._call_listener(self._listener.on_slices_lost, lost)

    # ----------------------------------------------------------------- helpers

    async def _reset_outside_log(self, outside: list[OutsideLog]) -> None:
        await self._outside_log_reset.apply(outside)

    async def _revoked_listener(self, slices: Slices) -> None:
        await self._call_listener(self._listener.on_slices_revoked, slices)

    def _wake_membership(self) -> None:
        if self._membership is not None:
            self._membership.wake()

    def _withdraw(self, slices: Slices) -> None:
        """Take buffered and queued records of ``slices`` back from delivery."""
        self._fetcher.withdraw(slices)
        for dispatcher in self._dispatchers:
            dispatcher.withdraw(slices)

    async def _until(self, awaitable: asyncio.Future[None]) -> None:
        while not awaitable.done():
            self._status.check_running()
            await asyncio.wait(
                {awaitable, self._status.change_future()}, return_when=asyncio.FIRST_COMPLETED
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


def default_client_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _nothing() -> None:
    return None
