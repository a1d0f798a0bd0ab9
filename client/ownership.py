"""What this member owns, as reconciliation changes it: the consumer's side of
``client.membership.SliceOwner``.

Each change updates the consumer's own state (the tracker's slices, the gate's leases, the
fetcher's assignment, the hand-out ledger) in the order docs/design.md §5 asks, and tells
every part through the lifecycle hooks' fan-out (``client.runtime.hooks``): ``assign`` ends
with ``assigned``; ``release`` (``client.release``) tells ``revoking``, ``stop_calls`` and
``revoked``; a loss tells ``lost`` the instant it is known (``lose``) and ``dropped``
once the slices are gone (``drop``).
"""

from __future__ import annotations

import logging

from client.committer import Committer
from client.errors import NoOffsetForPartition
from client.fetcher import Fetcher
from client.handout import HandedOut
from client.http import CoordinatorClient, Slices, StuckCall
from client.protocol.keyspace import normalize
from client.protocol.log_bounds import OffsetReset
from client.release import SliceRelease, describe
from client.runtime.gate import OwnershipGate
from client.runtime.hooks import Hooks, LifecycleHooks
from client.status import ConsumerStatus
from client.tracker import OffsetTracker

# The consumer's log, as operators (and the chaos suite's journal) read it.
logger = logging.getLogger("client.consumer")


class FetchedRecords(LifecycleHooks):
    """The fetcher's buffer as a part: records taken in and not handed out yet are dropped
    when their slices are being revoked or are lost."""

    def __init__(self, fetcher: Fetcher) -> None:
        self._fetcher = fetcher

    def revoking(self, slices: Slices) -> None:
        self._fetcher.revoking(slices)

    def lost(self, slices: Slices) -> None:
        self._fetcher.clear()


class Ownership:
    """The slices this member owns, and every change to them."""

    def __init__(
        self,
        client: CoordinatorClient,
        group_id: str,
        tracker: OffsetTracker,
        fetcher: Fetcher,
        handed: HandedOut,
        gate: OwnershipGate,
        committer: Committer,
        status: ConsumerStatus,
        hooks: Hooks,
        *,
        auto_offset_reset: OffsetReset,
        revoke_timeout_s: float,
    ) -> None:
        self._client = client
        self._group_id = group_id
        self._tracker = tracker
        self._fetcher = fetcher
        self._handed = handed
        self._gate = gate
        self._status = status
        self._hooks = hooks
        self._auto_offset_reset = auto_offset_reset
        # Revocations, and the keys held for calls that cannot be stopped.
        self.releasing = SliceRelease(
            group_id,
            tracker,
            fetcher,
            handed,
            gate,
            committer,
            hooks,
            wake=status.wake,
            session_deadline=status.session_deadline,
            revoke_timeout_s=revoke_timeout_s,
        )

    def owned_slices(self) -> Slices:
        """Every slice still held, including those being released (reported as owned)."""
        owned: Slices = {}
        for tp in self._tracker.partitions():
            owned[tp] = normalize(progress.keys for progress in self._tracker.slices_of(tp))
        return owned

    def active_slices(self) -> Slices:
        return self._tracker.owned()

    async def assign(self, added: Slices) -> None:
        async with self.releasing.changing:
            await self._assign(added)

    async def _assign(self, added: Slices) -> None:
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
            self.releasing.granted_again(added)
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
        await self._hooks.assigned(added)

    async def release(self, revoked: Slices) -> None:
        await self.releasing.release(revoked)

    def stuck_report(self) -> list[StuckCall]:
        return self.releasing.stuck_report()

    def lose(self) -> None:
        """The membership was just lost: nothing more starts."""
        self._lose(self.owned_slices())

    def _lose(self, lost: Slices) -> None:
        # Synchronous on purpose: it runs the instant the loss is known, before any other task
        # of this loop can hand a buffered or queued record to user code.
        self._gate.end()
        self._hooks.lost(lost)

    async def drop(self) -> None:
        async with self._fetcher.lock:
            lost = self._tracker.clear()
            self._lose(lost)
            self._handed.clear()
            self.releasing.clear()
            self._fetcher.sync(seek={})
        if lost:
            logger.warning(
                "slices lost", extra={"group_id": self._group_id, "slices": describe(lost)}
            )
            await self._hooks.dropped(lost)
