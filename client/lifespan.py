"""A ``KeyrangeConsumer``'s start and stop, each in its fixed order.

``start`` waits for the coordinator (so a wrong URL fails fast, naming it), learns its
limits, starts Kafka, then joins the group (or, standalone, starts applying ``assign``) and
the periodic commits. ``stop`` shuts the concerns down in the order docs/design.md §5 asks:
nothing starts in user code any more (the gate closes), reconciliation stops, the parts hear
``stopping`` (runtimes let started calls end within ``revoke_timeout_s``), calls that cannot
be stopped hold the leave, the final commit, ``revoked`` of what is still owned, the leave,
Kafka, HTTP.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from client.committer import Committer
from client.errors import ConsumerStopped
from client.fetcher import Fetcher
from client.http import CoordinatorClient, Slices
from client.membership import Membership, Reconciler
from client.ownership import Ownership
from client.runtime.gate import OwnershipGate
from client.runtime.hooks import Hooks
from client.status import ConsumerStatus

# The consumer's log, as operators read it.
logger = logging.getLogger("client.consumer")

# Time for the final commit and the leave after in-flight handlers had revoke_timeout_s:
# a few HTTP calls with their retries.
CLOSE_GRACE_S = 30.0


class Lifespan:
    """Starts and stops one consumer's concerns; holds its membership (None standalone) and
    its reconciler once started."""

    def __init__(
        self,
        client: CoordinatorClient,
        group_id: str,
        status: ConsumerStatus,
        committer: Committer,
        fetcher: Fetcher,
        gate: OwnershipGate,
        ownership: Ownership,
        hooks: Hooks,
        *,
        owns_client: bool,
        join: Callable[[], Membership] | None,
        auto_commit_interval_ms: int | None,
        revoke_timeout_s: float,
        start_timeout_s: float,
    ) -> None:
        self._client = client
        self._group_id = group_id
        self._status = status
        self._committer = committer
        self._fetcher = fetcher
        self._gate = gate
        self._ownership = ownership
        self._releasing = ownership.releasing
        self._hooks = hooks
        self._owns_client = owns_client
        self._join = join
        self._auto_commit_s = (
            None if auto_commit_interval_ms is None else auto_commit_interval_ms / 1000
        )
        self._revoke_timeout_s = revoke_timeout_s
        self._start_timeout_s = start_timeout_s
        self.membership: Membership | None = None
        self.reconciler: Reconciler | None = None
        self._standalone_target: Slices | None = None

    def set_target(self, target: Slices) -> None:
        """What a standalone consumer owns from now on (applied at the start if not yet
        started)."""
        self._standalone_target = target
        if self.reconciler is not None:
            self.reconciler.set_target(target)

    async def settled(self) -> None:
        """Until the consumer owns what the coordinator (or ``assign``) currently grants;
        raises what ends the consumer meanwhile."""
        self._status.check_running()
        if self.reconciler is None:
            raise ConsumerStopped("the consumer is not started")
        settled = asyncio.ensure_future(self.reconciler.wait_settled())
        try:
            while not settled.done():
                self._status.check_running()
                await asyncio.wait(
                    {settled, self._status.change_future()}, return_when=asyncio.FIRST_COMPLETED
                )
            settled.result()
        finally:
            settled.cancel()

    async def start(self) -> None:
        status = self._status
        if status.started:
            return
        status.started = True
        try:
            limits = await self._client.wait_until_reachable(self._start_timeout_s)
            self._committer.learn(limits)
            await self._fetcher.start()
        except BaseException:
            status.stopped = True
            if self._owns_client:
                await self._client.aclose()
            raise
        if self._join is not None:
            membership = self.membership = self._join()
            self._committer.membership = status.membership = membership
            self.reconciler = membership.reconciler
            membership.failure.add_done_callback(lambda _: status.notify())
            membership.start()
        else:
            self.reconciler = Reconciler(self._ownership, _nothing)
            self.reconciler.start()
            if self._standalone_target is not None:
                self.reconciler.set_target(self._standalone_target)
        self._committer.start(self._auto_commit_s)

    async def stop(self) -> None:
        if self._status.stopped or not self._status.started:
            self._status.stopped = True
            return
        self._status.stopped = True
        self._gate.close()
        self._status.notify()
        try:
            if self.reconciler is not None:
                await self.reconciler.stop()
            self._releasing.cancel_holds()
            try:
                # Bounded, so a runtime whose shutdown hangs cannot hang this one.
                async with asyncio.timeout(self._revoke_timeout_s + CLOSE_GRACE_S):
                    await self._hooks.stopping(self._revoke_timeout_s)
            except TimeoutError:
                logger.warning(
                    "the processing runtime did not finish in time",
                    extra={"group_id": self._group_id, "bound_s": self._revoke_timeout_s},
                )
            await self._releasing.hold(None)
            try:
                async with asyncio.timeout(CLOSE_GRACE_S):
                    await self._commit_and_leave()
            except TimeoutError:
                logger.warning(
                    "stop() exceeded its bound; closing without a final commit and leave",
                    extra={"bound_s": CLOSE_GRACE_S},
                )
        finally:
            await self._fetcher.stop()
            if self._owns_client:
                await self._client.aclose()

    async def _commit_and_leave(self) -> None:
        await self._committer.stop()
        await self._committer.commit(raise_errors=False)
        held = self._ownership.owned_slices()
        if held:
            await self._hooks.revoked(held)
        self._gate.end()
        if self.membership is not None:
            await self.membership.leave()


def _nothing() -> None:
    return None
