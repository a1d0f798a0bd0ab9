"""``KeyrangeConsumer``: a Kafka consumer that owns key-range slices instead of partitions.

It reads Kafka with one ``AIOKafkaConsumer`` in manual-assignment mode (membership is the
coordinator's, never a Kafka group), keeps the records whose key hash falls in an owned slice
and that the group has not processed yet, and commits what was processed to the coordinator
(``client.tracker`` builds the payload). Records of one key reach user code in offset order
and one at a time: ``async for`` and ``getmany`` hand records out in partition order, and
``run`` keeps one chain per key while different keys run concurrently.

Nothing is handed out once the membership is lost: before every hand-out (``records``,
``getmany``, ``run``'s runners, and before buffering a fetch) the consumer asks
``Membership.session_lost``, which reads the session deadline off the monotonic clock, so a
member frozen or blocked past its session hands out nothing after it resumes, even before its
heartbeat learns what the coordinator did meanwhile (docs/design.md §5, docs/membership.md).

Delivery is at least once. A record counts as processed when it is marked: ``async for``
marks the previous record when the next one is requested (unless ``auto_mark=False``),
``getmany`` leaves marking to the caller, ``run`` marks after the handler returns.

The consumer is a front over parts, one job each: ``client.fetcher`` reads Kafka and keeps
what may be handed out, ``client.handing`` hands records out and takes their marks,
``client.handout`` tracks what user code holds (and drains it before a revoke),
``client.committer`` commits, ``client.dispatch`` is ``run()``'s runtime,
``client.ownership`` follows the slice changes reconciliation asks for (``client.release``
gives slices up), ``client.lifespan`` starts and stops the concerns in their order,
``client.membership`` heartbeats and reconciles, and ``client.status`` holds where the
consumer stands and the hand-out guard, which the parts ask instead of the front. Every part
that holds records hears ownership changes and the stop through one fan-out, the lifecycle
hooks (``client.runtime.hooks``); ``run`` registers its dispatcher there, as the worker's and
the streams' composition roots do their runtimes. The front owns the public API and builds
the parts; ``drive`` builds the seams a runtime uses (``client.consumer_source``).

Concerns and their tasks: the Kafka fetch runs in the caller's ``async for``/``getmany``
(aiokafka prefetches in its own task), periodic commits in one task, and in group mode the
heartbeat and the reconciliation in one task each (``client.membership``). ``stop`` shuts
them down in a fixed order (``client.lifespan``): the runtimes, reconciliation, final commit,
leave the group, Kafka, HTTP.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from functools import partial
from types import TracebackType
from typing import Any, cast

from aiokafka.structs import TopicPartition

from client.committer import Committer
from client.consumer_source import ConsumerSource
from client.dispatch import Dispatcher, Handler
from client.errors import ConsumerStopped, InvalidRequest
from client.fetcher import Fetcher, Record
from client.handing import HandOut
from client.handout import HandedOut
from client.http import CoordinatorClient, Slices
from client.lifespan import Lifespan
from client.log_reset import OutsideLogReset
from client.membership import Membership
from client.ownership import FetchedRecords, Ownership
from client.protocol.keyspace import KeyRange, normalize
from client.protocol.log_bounds import OFFSET_RESETS, OffsetReset
from client.runtime.gate import OwnershipGate, Running
from client.runtime.hooks import Hooks
from client.runtime.seams import Runtime
from client.status import ConsumerStatus
from client.tracing import record_tracer
from client.tracker import CommitMode, OffsetTracker

__all__ = ["ConsumerStopped", "Handler", "KeyrangeConsumer", "RebalanceListener", "Record"]


class RebalanceListener:
    """Callbacks on slice ownership changes, each given ``{TopicPartition: [KeyRange]}``.

    ``on_slices_revoked`` runs after in-flight records of the slices finished (or the revoke
    timeout passed) and their progress was committed; ``on_slices_lost`` runs when the
    slices were taken away without a chance to commit (fenced, session expired), and by
    default does what ``on_slices_revoked`` does, as Kafka's ``onPartitionsLost`` does.
    Each is called once every part of the consumer and its runtime has acted on the change
    (the lifecycle hooks' order, ``client.runtime.hooks``).
    """

    async def on_slices_assigned(self, slices: Slices) -> None:
        return None

    async def on_slices_revoked(self, slices: Slices) -> None:
        return None

    async def on_slices_lost(self, slices: Slices) -> None:
        await self.on_slices_revoked(slices)


class KeyrangeConsumer:
    """Consume key-range slices of Kafka partitions, as a group member or standalone.

    With ``topics`` the consumer joins ``group_id`` through the coordinator and follows the
    assignment it gets; without topics call ``assign()`` to own slices directly (standalone:
    no membership, commits carry no member id and are accepted only while the group has no
    live members). ``aiokafka_kwargs`` go to ``AIOKafkaConsumer`` (``key_deserializer`` and
    ``value_deserializer`` are applied by Keyrange after hashing the raw key).

    ``commit_mode`` overrides what commits carry (``client.tracker``): ``"watermarks"`` (the default
    with individual commit), ``"ranges"`` (plain IC ranges, the KIP's baseline) or ``"offset"``
    (classic offsets; the default with ``allow_individual_commit=False``). ``coordinator`` shares
    one ``CoordinatorClient`` between consumers; it is then not closed by ``stop()``.

    ``start()`` waits up to ``coordinator_start_timeout_ms`` for the coordinator to answer and then
    raises ``CoordinatorUnavailable`` naming the URL, so a wrong ``coordinator_url`` fails fast.
    ``auto_offset_reset`` (``earliest``, ``latest`` or ``none``) applies to partitions the group
    never committed and to a position outside the partition's log (``client.log_reset``).
    """

    endpoint: str | None = None  # where it serves queries, advertised at the join (read at start)

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
        key_deserializer, value_deserializer = _deserializers(aiokafka_kwargs)
        kafka_kwargs = {
            "bootstrap_servers": bootstrap_servers,
            **({} if client_id is None else {"client_id": client_id}),
            **aiokafka_kwargs,
        }
        client = coordinator or CoordinatorClient(coordinator_url, token=token)
        mode: CommitMode = "watermarks" if allow_individual_commit else "offset"
        self._tracker = tracker = OffsetTracker(mode=commit_mode or mode)
        self._status = status = ConsumerStatus()
        self._fetcher = fetcher = Fetcher(
            tracker,
            kafka_kwargs,
            key_deserializer=key_deserializer,
            value_deserializer=value_deserializer,
            status=status,
            on_outside_log=lambda outside: outside_log_reset.apply(outside),
            subscribed=self._topics,
        )
        self._handed = handed = HandedOut()
        # Asked by every runtime right before user code starts a record (docs/design.md §5).
        self._gate = gate = OwnershipGate(status.session_deadline)
        self._committer = committer = Committer(
            client, group_id, tracker, may_commit=status.may_hand_out
        )
        self._group_id = group_id
        self._hooks = hooks = Hooks(group_id, rebalance_listener or RebalanceListener())
        self._hand_out = HandOut(
            fetcher, handed, tracker, committer, status, max_ranges=max_num_ranges_to_commit
        )
        # The consumer's own parts hear every change first, in this order.
        hooks.register(FetchedRecords(fetcher))
        hooks.register(self._hand_out)
        reset = cast(OffsetReset, auto_offset_reset)
        outside_log_reset = OutsideLogReset(
            client,
            group_id,
            tracker,
            fetcher,
            reset,
            identity=status.identity,
            revoking=hooks.revoking,
        )
        self._ownership = ownership = Ownership(
            client,
            group_id,
            tracker,
            fetcher,
            handed,
            gate,
            committer,
            status,
            hooks,
            auto_offset_reset=reset,
            revoke_timeout_s=revoke_timeout_s,
        )
        join = partial(
            Membership,
            client,
            group_id,
            ownership,
            topics=self._topics,
            assignor=assignor,
            allow_individual_commit=allow_individual_commit,
            session_timeout_ms=session_timeout_ms,
            instance_id=instance_id,
            # Shown beside the member in the admin API, the CLI and the console: by default
            # one that finds the process (host and pid), as "-" found nothing.
            client_id=client_id if client_id is not None else default_client_id(),
        )
        self._lifespan = Lifespan(
            client,
            group_id,
            status,
            committer,
            fetcher,
            gate,
            ownership,
            hooks,
            owns_client=coordinator is None,
            join=(lambda: join(endpoint=self.endpoint)) if self._topics else None,
            auto_commit_interval_ms=auto_commit_interval_ms,
            revoke_timeout_s=revoke_timeout_s,
            start_timeout_s=coordinator_start_timeout_ms / 1000,
        )

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
        await self._lifespan.start()

    async def stop(self) -> None:
        """Let what runs finish, commit what was processed, leave the group and close every
        connection.

        Nothing starts in user code once this is called. Records in processing get
        ``revoke_timeout_s``; then calls that can be stopped are (cancelled, their process
        killed) and those that cannot, on threads, hold the leave: the member goes on
        heartbeating, so their keys stay here until they end (docs/design.md §5). A second signal or
        a kill ends the process, and the calls with it, for an operator who will not wait.
        """
        await self._lifespan.stop()

    # ----------------------------------------------------------------- public API

    def assign(self, slices: Mapping[TopicPartition, Sequence[KeyRange]]) -> None:
        """Own exactly these slices (standalone mode); an empty list means the whole
        partition. Slices dropped by a later call are committed and released."""
        if self._topics:
            raise InvalidRequest("assign() is for standalone consumers created without topics")
        full = KeyRange.full()
        self._lifespan.set_target({tp: normalize(r or [full]) for tp, r in slices.items()})

    def assignment(self) -> Slices:
        """The slices whose records are handed out now."""
        return self._tracker.owned()

    async def wait_for_assignment(self) -> Slices:
        """Until the consumer owns what the coordinator (or ``assign``) currently grants."""
        await self._lifespan.settled()
        return self.assignment()

    @property
    def gate(self) -> OwnershipGate:
        """Asked by every runtime right before user code starts a record (docs/design.md §5)."""
        return self._gate

    @property
    def hooks(self) -> Hooks:
        """The lifecycle hooks' fan-out (``client.runtime.hooks``): a composition root
        registers the runtime it built, to have it told of ownership changes and the stop."""
        return self._hooks

    @property
    def member_id(self) -> str | None:
        return self._status.identity()[0]

    @property
    def member_epoch(self) -> int | None:
        membership = self._lifespan.membership
        return None if membership is None else membership.member_epoch

    def report_standbys(self, standbys: Slices) -> None:
        """Key ranges kept warm here, for the assignor (docs/api.md, "Standby key ranges")."""
        self._status.report_standbys(standbys)

    def __aiter__(self) -> AsyncIterator[Record]:
        return self.records()

    def records(self, *, auto_mark: bool = True) -> AsyncIterator[Record]:
        """Records one at a time; with ``auto_mark`` each is marked processed when the next
        one is requested, so leaving the loop early leaves the last one unmarked."""
        return self._hand_out.records(auto_mark=auto_mark)

    async def getmany(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[Record]]:
        """A batch by partition, like ``AIOKafkaConsumer.getmany``; mark each record with
        ``mark_processed`` once done."""
        return await self._hand_out.getmany(timeout_ms, max_records)

    def mark_all_processed(self, records: Iterable[Record]) -> None:
        """``mark_processed`` for each of ``records``. The oldest unmarked ``getmany`` batch of
        a partition, processed in order, is marked in one step instead of one per record."""
        self._hand_out.mark_all_processed(records)

    def mark_processed(self, record: Record) -> None:
        """Count ``record`` as processed; marks of records no longer owned are ignored."""
        self._hand_out.mark_processed(record)

    def still_owned(self, record: Record) -> bool:
        """Whether ``record``, handed out and not marked yet, is still this consumer's to
        process: False once its slice was released after the revoke timeout or lost, and from
        the instant the session deadline passes. Ask it right before a side effect (it costs
        a clock read and a lookup); what it cannot cover, a handler frozen between asking and
        acting, needs a fence downstream (docs/membership.md, "Zombie members")."""
        return self._hand_out.still_owned(record)

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
        dispatchers: list[Dispatcher] = []

        def make(source: ConsumerSource) -> Dispatcher:
            # ``run`` is its dispatcher's composition root: the dispatcher hears the hooks
            # while it runs.
            dispatcher = Dispatcher(
                source,
                handler,
                max_concurrency,
                cancel_on_loss=cancel_on_loss,
                tracer=record_tracer("run", self._group_id, lambda: self.member_id),
            )
            dispatchers.append(dispatcher)
            self._hooks.register(dispatcher)
            return dispatcher

        try:
            await self.drive(make)
        finally:
            for dispatcher in dispatchers:
                self._hooks.unregister(dispatcher)

    async def drive(self, make_runtime: Callable[[ConsumerSource], Runtime]) -> None:
        """Run a processing runtime over this consumer's records until ``stop()``: what
        ``run`` does with its dispatcher, open to other runtimes (``client.worker``). The
        runtime hears ownership changes and the stop once its composition root registered it
        with ``hooks``, as ``run`` does its dispatcher."""
        source = ConsumerSource(
            self._fetcher,
            self._handed,
            self._tracker,
            self._gate,
            self._status,
            mark_processed=self._hand_out.mark_processed,
        )
        await make_runtime(source).run()

    def stuck_calls(self) -> list[Running]:
        """Calls that cannot be stopped, holding keys of slices this member gave up (or the
        leave): for metrics and for the coordinator to show."""
        return self._ownership.releasing.stuck_calls()


Deserializer = Callable[[bytes], Any]


def _deserializers(
    aiokafka_kwargs: dict[str, Any],
) -> tuple[Deserializer | None, Deserializer | None]:
    """aiokafka's deserializers, taken out of its settings: the consumer applies them to the
    records it keeps, after judging their keys on the raw bytes."""
    return aiokafka_kwargs.pop("key_deserializer", None), aiokafka_kwargs.pop(
        "value_deserializer", None
    )


def default_client_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"
