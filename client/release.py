"""Giving slices up as docs/design.md §5 asks: a slice is reported released only when no call
of its keys runs, in any runtime on the consumer.

A revocation first ends the slices' leases in the ownership gate, so nothing of them starts
any more, and tells every part ``revoking`` (``client.runtime.hooks``), which gives back what
is queued. Records in processing get ``revoke_timeout_s`` to finish; past it, the parts stop
what can be stopped (``stop_calls``: a loop call cancelled, a process killed) and the gate
shows what still runs: calls on threads and a worker task's acknowledgements still pending,
which nothing can stop. Their keys within the revoked range, and nothing beside them, stay
with this member as single-hash slices (a streams round: its task's revoked part), reported as
owned, so the heir gets the rest of the range at once; they are named in a WARNING now and
then, counted for metrics, reported to the coordinator, and released once their calls end,
unless granted back meanwhile (they are this member's again then). Once nothing of a slice
runs and its progress is committed, the parts hear ``revoked`` and the slice is released.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from client.committer import Committer
from client.errors import CoordinatorUnavailable, KeyrangeClientError
from client.fetcher import Fetcher
from client.handout import HandedOut
from client.http import Slices, StuckCall
from client.membership import slices_minus
from client.protocol.keyspace import HASH_SPACE, intersect, normalize
from client.runtime.gate import OwnershipGate, Running, pieces_of
from client.runtime.hooks import Hooks
from client.tracker import OffsetTracker

logger = logging.getLogger("client.consumer")

# How often a call that cannot be stopped, holding its key, is named again in the log: often
# enough that an operator watching sees it is still there, rarely enough not to flood.
HOLD_WARNING_INTERVAL_S = 10.0
# How long calls that were just stopped (cancelled, their process killed) get to be seen
# ending before a revocation counts them as calls that cannot be stopped.
STOPPED_CALLS_GRACE_S = 1.0
# A release's commit asked again while the coordinator does not answer: soon at first (a
# blip), then no more often than a heartbeat, until the session deadline.
COMMIT_RETRY_INITIAL_S = 0.2
COMMIT_RETRY_MAX_S = 2.0


class SliceRelease:
    """The consumer's revocations, and the keys held for calls that cannot be stopped."""

    def __init__(
        self,
        group_id: str,
        tracker: OffsetTracker,
        fetcher: Fetcher,
        handed: HandedOut,
        gate: OwnershipGate,
        committer: Committer,
        hooks: Hooks,
        *,
        wake: Callable[[], None],
        session_deadline: Callable[[], float],
        revoke_timeout_s: float,
    ) -> None:
        self._group_id = group_id
        self._tracker = tracker
        self._fetcher = fetcher
        self._handed = handed
        self._gate = gate
        self._committer = committer
        self._hooks = hooks
        self._wake = wake
        self._session_deadline = session_deadline
        self._revoke_timeout_s = revoke_timeout_s
        # Keys kept for calls that could not be stopped, and the tasks releasing them.
        self._held: Slices = {}
        self._holds: set[asyncio.Task[None]] = set()
        self._stuck: list[Running] = []
        # Taken by a grant and by the end of a hold, so a held key granted back is never
        # released under the grant (``revoked`` told of a key the member owns again).
        self.changing = asyncio.Lock()

    async def release(self, revoked: Slices) -> None:
        """Give ``revoked`` up: nothing of it starts from now on; records in processing get
        ``revoke_timeout_s`` to finish; then calls that can be stopped are, and the keys of
        calls that cannot stay owned, as single-hash slices, until those calls end. The rest
        is committed and released at once.

        What still runs is the gate's to say, whatever the drain found: a record forgotten
        by an earlier release, or a call whose record was given back, runs without being
        handed out."""
        async with self._fetcher.lock:
            for tp, ranges in revoked.items():
                self._tracker.deactivate(tp, ranges)
            self._gate.revoke(revoked)
            self._hooks.revoking(revoked)
        deadline = time.monotonic() + self._revoke_timeout_s
        drained = await self._handed.drain(revoked, self._revoke_timeout_s)
        if drained:
            drained = await self._gate.until_ended(revoked, deadline - time.monotonic())
        if not drained:
            await self._hooks.stop_calls(revoked)
            await self._gate.until_ended(revoked, STOPPED_CALLS_GRACE_S)
        held = pieces_of(self._gate.running_in(revoked), revoked)
        if not drained and not held and self._handed.any_in(revoked):
            # Handed out by ``async for`` or ``getmany`` and not marked: the consumer
            # cannot see whether user code still works on them (docs/guarantees.md).
            logger.warning(
                "revoke timeout: releasing slices with records handed out and not marked",
                extra={"group_id": self._group_id, "slices": describe(revoked)},
            )
        await self._commit(revoked)
        released = slices_minus(revoked, held)
        if released:
            await self._hooks.revoked(released)
        async with self._fetcher.lock:
            self._held = _union(self._held, held)
            self._tracker.remove_inactive(revoked, keep=self._held)
            # Nothing of ``released`` was handed out since the revocation: what is left of it
            # was handed out under the leases that just ended.
            self._handed.forget(released)
            self._fetcher.sync(seek={})
        logger.info(
            "slices released",
            extra={"group_id": self._group_id, "slices": describe(released)},
        )
        if held:
            hold = asyncio.create_task(self._release_when_ended(held), name="keyrange-hold")
            self._holds.add(hold)
            hold.add_done_callback(self._holds.discard)

    async def _release_when_ended(self, held: Slices) -> None:
        """Release the keys a revocation kept for calls that could not be stopped, once
        those calls have ended: only those not granted back meanwhile, which are this
        member's again (their next records run under the new grant and are its to mark)."""
        generation = self._gate.generation
        if not await self.hold(held, still_held=True):
            return
        async with self.changing:
            ended = _intersection(held, self._held)
            if not ended:
                return
            await self._commit(ended)
            if self._gate.generation != generation:
                return
            await self._hooks.revoked(ended)
            async with self._fetcher.lock:
                self._held = slices_minus(self._held, ended)
                self._tracker.remove_inactive(ended, keep=self._held)
                # Not granted back since the revocation: what is left of them was handed out
                # under the leases it ended.
                self._handed.forget(ended)
        logger.info(
            "held keys released", extra={"group_id": self._group_id, "slices": describe(ended)}
        )
        self._wake()

    async def _commit(self, releasing: Slices) -> None:
        """Commit before ``releasing`` goes: what is not committed then is the heir's to
        process again. A coordinator that does not answer is asked again until the session
        deadline (a restart of the coordinator or a network blip costs no duplicates); past
        it, or on an answer retrying cannot change, the slices go uncommitted and a WARNING
        names what was processed and not committed."""
        backoff = COMMIT_RETRY_INITIAL_S
        while True:
            # A request the network swallows must not outlive the session: the loss at the
            # deadline would cancel the release before it could say what it leaves.
            remaining = self._session_deadline() - time.monotonic() - COMMIT_RETRY_INITIAL_S
            try:
                if remaining <= 0:
                    raise CoordinatorUnavailable("no time left in the session to commit")
                async with asyncio.timeout(None if math.isinf(remaining) else remaining):
                    await self._committer.commit(raise_errors=True)
                return
            except (KeyrangeClientError, TimeoutError) as error:
                retriable = isinstance(error, KeyrangeClientError) and error.retriable
                retry = retriable and time.monotonic() + backoff < self._session_deadline()
                if not retry:
                    logger.warning(
                        "releasing slices whose processed records are not committed; the "
                        "next owner processes them again",
                        extra={
                            "group_id": self._group_id,
                            "slices": describe(releasing),
                            "uncommitted": _uncommitted(self._tracker, releasing),
                            "error": str(error) or type(error).__name__,
                        },
                    )
                    return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, COMMIT_RETRY_MAX_S)

    async def hold(self, slices: Slices | None, *, still_held: bool = False) -> bool:
        """Until no call of ``slices`` (of any slice with None) is in user code: True, or
        False when the membership was lost meanwhile (its keys are gone; what still runs is
        the frozen-mid-call case). With ``still_held``, only the keys of ``slices`` not
        granted back count: a call of a key granted back runs under the grant. Each call
        still running is named in a WARNING now and then, reported to the coordinator and
        counted by ``stuck_calls``."""
        generation = self._gate.generation
        warned_at = float("-inf")
        waiting = slices
        while calls := self._gate.running_in(waiting):
            if self._gate.generation != generation:
                return False
            now = time.monotonic()
            if now - warned_at >= HOLD_WARNING_INTERVAL_S:
                warned_at = now
                self._stuck += [call for call in calls if call not in self._stuck]
                for call in calls:
                    hashed, offset = call.record()
                    logger.warning(
                        "a call that cannot be stopped holds its key; the key moves once it ends",
                        extra={
                            "group_id": self._group_id,
                            "topic": call.tp.topic,
                            "partition": call.tp.partition,
                            "key_hash": hashed,
                            "offset": offset,
                            "held_keys": str(call.keys),
                            "running_s": round(call.running_s(now), 3),
                        },
                    )
                self._wake()
            await self._gate.until_ended(waiting, HOLD_WARNING_INTERVAL_S)
            if still_held and slices is not None:
                waiting = _intersection(slices, self._held)
                if not waiting:
                    break
        self._stuck = self.stuck_calls()
        return True

    def stuck_calls(self) -> list[Running]:
        return [call for call in self._stuck if self._gate.is_running(call)]

    def stuck_report(self) -> list[StuckCall]:
        now = time.monotonic()
        report = []
        for call in self.stuck_calls():
            hashed, offset = call.record()
            if offset >= 0:
                report.append(
                    StuckCall(call.tp.topic, call.tp.partition, hashed, offset, call.running_s(now))
                )
        return report

    def granted_again(self, added: Slices) -> None:
        """Held keys granted back: ours again (the runtime runs the key's next record only
        after the call, one chain per key); the holds waiting for their calls look again."""
        self._held = slices_minus(self._held, added)
        self._gate.wake_waiters()

    def clear(self) -> None:
        """The membership is lost: nothing is held any more."""
        self._held = {}

    def cancel_holds(self) -> None:
        """The member stops: its own wait covers every call still running."""
        for hold in list(self._holds):
            hold.cancel()


def _intersection(left: Slices, right: Slices) -> Slices:
    both: Slices = {}
    for tp, ranges in left.items():
        common = intersect(ranges, right.get(tp, ()))
        if common:
            both[tp] = common
    return both


def _uncommitted(tracker: OffsetTracker, releasing: Slices) -> list[str]:
    """Per slice of ``releasing`` with processed records not committed: where its committed
    watermark is, where its processed watermark is, and how many records beyond it were
    processed (what the next owner processes again)."""
    lines = []
    for tp, ranges in releasing.items():
        for progress in tracker.slices_of(tp):
            if not any(progress.keys.overlaps(keys) for keys in ranges):
                continue
            if progress.watermark > progress.committed_watermark or progress.uncommitted:
                lines.append(
                    f"{tp.topic}[{tp.partition}] keys {progress.keys}: committed up to "
                    f"{progress.committed_watermark}, processed up to {progress.watermark} "
                    f"and {len(progress.uncommitted)} records beyond"
                )
    return lines


def _union(left: Slices, right: Slices) -> Slices:
    union: Slices = {tp: list(ranges) for tp, ranges in left.items()}
    for tp, ranges in right.items():
        union[tp] = normalize([*union.get(tp, []), *ranges])
    return union


def describe(slices: Slices) -> list[str]:
    """One line per partition for logs, e.g. ``orders[0] all keys`` or ``orders[3] keys
    [0, 4611686018427387903] (50%)``: what a person reading the log can act on."""
    lines = []
    for tp, ranges in slices.items():
        share = sum(keys.size for keys in ranges) / HASH_SPACE
        if share == 1:
            lines.append(f"{tp.topic}[{tp.partition}] all keys")
            continue
        spans = ", ".join(str(keys) for keys in ranges)
        lines.append(f"{tp.topic}[{tp.partition}] keys {spans} ({share:.0%})")
    return lines
