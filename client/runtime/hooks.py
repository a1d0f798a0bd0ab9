"""The lifecycle hooks (docs/architecture.md, "Events: the lifecycle hooks"): the one channel
through which every part that holds a consumer's records hears that its slices changed or
that it stops, and the one fan-out that tells them, always in the same order.

In the manner of kafka-workers' listeners, parts register with the fan-out and unregister
from it: the consumer registers its own parts when it is built (the fetch buffer, then the
hand-out API), and a composition root (``run()``, ``Worker``, ``StreamsApp``) registers the
runtime it built and unregisters it once the consumer stopped (a root that registers its
runtime after slices were granted tells it ``assigned`` of them itself). Nothing reaches a
runtime's ownership changes by another road.

**The order.** Every hook goes to the parts in the order they registered (the consumer's
own, then the runtimes), and then to the user's ``RebalanceListener`` for the three events
it names: ``on_slices_assigned`` after ``assigned``, ``on_slices_revoked`` after
``revoked``, ``on_slices_lost`` after ``dropped``. So the user hears of a change only once
every part has acted on it. The consumer calls the hooks in the order of docs/design.md §5:
``revoking``, then (past the revoke timeout) ``stop_calls``, then, once no call of the
slices runs and their progress is committed, ``revoked``; on a loss ``lost`` at once and
``dropped`` once the consumer dropped the slices; ``stopping`` when it stops.

**Sync and async.** ``revoking`` and ``lost`` are synchronous on purpose: they run the
instant the change is known, before any other task of the loop can hand a buffered or queued
record to user code, so nothing of the slices starts after them. ``assigned`` is synchronous
too: a part only starts taking the slices' records. The hooks that wait for work to end
(``stop_calls``, ``revoked``, ``dropped``, ``stopping``) are coroutines, awaited part by
part.

**Failures.** A part's failure in ``assigned``, ``revoked`` or ``dropped`` (a streams task
whose flush failed) or the user listener's is logged and the next part still hears the
event: the change happened, and every part must follow it. ``revoking`` and ``lost`` are the
safety steps and ``stop_calls`` and ``stopping`` the ones a release or a stop waits on: their
failures are raised to the caller.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from client.http import Slices

logger = logging.getLogger(__name__)


class LifecycleHooks(Protocol):
    """What a part hears. Each hook does nothing by default; a part subclasses this and
    overrides the events it acts on."""

    def assigned(self, slices: Slices) -> None:
        """The coordinator granted ``slices``: start taking their records."""
        return None

    def revoking(self, slices: Slices) -> None:
        """The coordinator asked for ``slices`` back: at once, hand out nothing more of them
        and give back (or drop) what is queued; calls in processing go on."""
        return None

    async def stop_calls(self, slices: Slices) -> None:
        """The revoke timeout passed with calls of ``slices`` still in processing: stop
        those that can be stopped (cancel them, kill their process) and give their records
        back; calls that cannot be stopped run on, and the gate shows them holding their
        keys."""
        return None

    async def revoked(self, slices: Slices) -> None:
        """No call of ``slices`` runs or can start and their progress is committed: drop
        their state. The slices are then released."""
        return None

    def lost(self, slices: Slices) -> None:
        """The session deadline passed or the member was fenced (``slices`` is everything
        it held): at once, nothing more starts; stop what can be stopped, commit nothing."""
        return None

    async def dropped(self, slices: Slices) -> None:
        """The consumer dropped the lost ``slices`` (nothing of them is buffered, tracked or
        held for user code any more): drop their state, commit nothing."""
        return None

    async def stopping(self, timeout_s: float | None) -> None:
        """The consumer stops: take in nothing more, give back what is queued, let started
        calls end within ``timeout_s``."""
        return None


class SliceListener(Protocol):
    """The user's view of the events (``client.consumer.RebalanceListener``)."""

    async def on_slices_assigned(self, slices: Slices) -> None: ...

    async def on_slices_revoked(self, slices: Slices) -> None: ...

    async def on_slices_lost(self, slices: Slices) -> None: ...


class Hooks:
    """The fan-out: registered parts in registration order, then the user's listener."""

    def __init__(self, group_id: str, listener: SliceListener) -> None:
        self._group_id = group_id
        self._listener = listener
        self._parts: list[LifecycleHooks] = []

    def register(self, part: LifecycleHooks) -> None:
        """Tell ``part`` of every event from now on, after the parts registered before it."""
        if part not in self._parts:
            self._parts.append(part)

    def unregister(self, part: LifecycleHooks) -> None:
        if part in self._parts:
            self._parts.remove(part)

    async def assigned(self, slices: Slices) -> None:
        for part in tuple(self._parts):
            try:
                part.assigned(slices)
            except Exception:
                self._failed(part, "assigned")
        await self._tell_listener(self._listener.on_slices_assigned, slices)

    def revoking(self, slices: Slices) -> None:
        for part in tuple(self._parts):
            part.revoking(slices)

    async def stop_calls(self, slices: Slices) -> None:
        for part in tuple(self._parts):
            await part.stop_calls(slices)

    async def revoked(self, slices: Slices) -> None:
        for part in tuple(self._parts):
            try:
                await part.revoked(slices)
            except Exception:
                self._failed(part, "revoked")
        await self._tell_listener(self._listener.on_slices_revoked, slices)

    def lost(self, slices: Slices) -> None:
        for part in tuple(self._parts):
            part.lost(slices)

    async def dropped(self, slices: Slices) -> None:
        for part in tuple(self._parts):
            try:
                await part.dropped(slices)
            except Exception:
                self._failed(part, "dropped")
        await self._tell_listener(self._listener.on_slices_lost, slices)

    async def stopping(self, timeout_s: float | None) -> None:
        for part in tuple(self._parts):
            await part.stopping(timeout_s)

    async def _tell_listener(
        self, callback: Callable[[Slices], Awaitable[None]], slices: Slices
    ) -> None:
        try:
            await callback(slices)
        except Exception:
            logger.exception(
                "rebalance listener failed",
                extra={"group_id": self._group_id, "callback": callback.__name__},
            )

    def _failed(self, part: LifecycleHooks, hook: str) -> None:
        logger.exception(
            "a part failed to follow an ownership change",
            extra={"group_id": self._group_id, "part": type(part).__name__, "hook": hook},
        )
