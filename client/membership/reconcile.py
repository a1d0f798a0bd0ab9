"""Reconciliation: moving what the consumer owns towards what the coordinator last assigned
(docs/design.md §5, "Targets").

It runs as a task of its own beside the heartbeat loop, so the member keeps heartbeating while
a revocation drains in-flight work. It first releases ``owned - assignment`` (stop, drain,
commit, notify) and tells the heartbeat so the smaller ``owned`` is reported at once, then
assigns ``assignment - owned`` and reports that too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from aiokafka.structs import TopicPartition

from client.errors import KeyrangeClientError
from client.http import Slices, StuckCall
from client.protocol.keyspace import KeyRange, normalize, subtract

logger = logging.getLogger(__name__)

# Retry backoff, for a failed reconciliation here and a failed heartbeat in the heartbeat
# loop: quick first retries for a coordinator replica restart, capped so a member notices a
# returning coordinator within a couple of seconds.
BACKOFF_INITIAL_S = 0.1
BACKOFF_MAX_S = 2.0


class SliceOwner(Protocol):
    """What the consumer exposes to reconciliation."""

    def owned_slices(self) -> Slices:
        """Every slice still held, including those being released (reported as owned)."""

    def active_slices(self) -> Slices:
        """Slices whose records are being handed out."""

    async def release(self, revoked: Slices) -> None: ...

    async def assign(self, added: Slices) -> None: ...

    async def drop(self) -> None: ...

    def lose(self) -> None:
        """Hand nothing more out, at once: the membership was just lost. Called before
        ``drop``, which drops the slices themselves once it gets its turn."""

    def stuck_report(self) -> list[StuckCall]:
        """Calls that cannot be stopped, holding keys of slices being given up, for the
        coordinator to show (docs/api.md, "Stuck calls")."""


def slices_minus(left: Mapping[TopicPartition, Sequence[KeyRange]], right: Slices) -> Slices:
    result: Slices = {}
    for tp, ranges in left.items():
        rest = subtract(ranges, right.get(tp, ()))
        if rest:
            result[tp] = rest
    return result


class Reconciler:
    """Applies target assignments one at a time, in the order revoke-then-assign."""

    def __init__(self, owner: SliceOwner, on_owned_changed: Callable[[], None]) -> None:
        self._owner = owner
        self._on_owned_changed = on_owned_changed
        self._target: Slices = {}
        # The last refusal that retrying cannot help, already logged.
        self._refused: str | None = None
        self._changed = asyncio.Event()
        self._settled = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="keyrange-reconciler")

    def set_target(self, target: Slices) -> None:
        # Applied even when unchanged: the diff is cheap, and it retries an assignment that
        # failed and settles waiters when the grant is empty.
        normalized = {tp: normalize(ranges) for tp, ranges in target.items() if ranges}
        if normalized != self._target:
            self._settled.clear()
        self._target = normalized
        self._changed.set()

    async def wait_settled(self) -> None:
        """Until what the consumer owns matches the latest target."""
        await self._settled.wait()

    async def reset(self) -> None:
        """Abandon whatever is in progress and drop every slice (the membership is lost)."""
        await self.stop()
        self._target = {}
        await self._owner.drop()
        self.start()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        backoff = BACKOFF_INITIAL_S
        while True:
            await self._changed.wait()
            self._changed.clear()
            try:
                await self._apply(self._target)
            except KeyrangeClientError as error:
                if error.retriable:
                    logger.warning(
                        "applying the assignment failed; retrying", extra={"error": str(error)}
                    )
                else:
                    # Retrying cannot help (the consumer already raises it to its caller):
                    # say it once, and try again only when the assignment next changes.
                    if str(error) != self._refused:
                        logger.error(
                            "applying the assignment failed: %s",
                            error,
                            extra={"error": error.error},
                        )
                    self._refused = str(error)
                    continue
                self._changed.set()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
                continue
            except Exception:
                logger.exception("applying the assignment failed; retrying")
                self._changed.set()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
                continue
            self._refused = None
            backoff = BACKOFF_INITIAL_S
            if not self._changed.is_set():
                self._settled.set()

    async def _apply(self, target: Slices) -> None:
        revoked = slices_minus(self._owner.active_slices(), target)
        if revoked:
            await self._owner.release(revoked)
            self._on_owned_changed()
        added = slices_minus(target, self._owner.active_slices())
        if added:
            await self._owner.assign(added)
            self._on_owned_changed()
