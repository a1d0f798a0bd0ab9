"""Where a ``KeyrangeConsumer`` stands, as its parts ask it: started or stopped, failed, and
whether its membership still lets it hand records out (docs/design.md §5).

The parts that wait or hand out (``client.fetcher``, ``client.consumer_source``, the ownership
gate, the committer) are given this object instead of the consumer, so none of them reaches
into the consumer's front and the front does not have to lend them its private methods.
"""

from __future__ import annotations

import asyncio

from client.errors import ConsumerStopped, KeyrangeClientError
from client.http import Slices
from client.membership import Membership


class ConsumerStatus:
    """The consumer's state and the hand-out guard, one object for every part that asks."""

    def __init__(self) -> None:
        self.started = False
        self.stopped = False
        # Raised to whoever consumes next: set where the consumer cannot go on by itself.
        self.failure: KeyrangeClientError | None = None
        # Set once, when a consumer with topics starts; None for a standalone one.
        self.membership: Membership | None = None
        self._changed: asyncio.Future[None] | None = None

    def check_running(self) -> None:
        """Raise what ends the consumer: it is stopped (or never started), it failed, or its
        membership failed."""
        if self.stopped or not self.started:
            raise ConsumerStopped("the consumer is not running")
        if self.failure is not None:
            raise self.failure
        if self.membership is not None and self.membership.failure.done():
            self.membership.failure.result()

    def may_hand_out(self) -> bool:
        """The guard before every hand-out (docs/design.md §5, the client half of the safety
        invariant); asking it is what notices a session deadline passed during a freeze."""
        return self.membership is None or not self.membership.session_lost()

    def session_deadline(self) -> float:
        """``may_hand_out`` as an instant, for checks made off the event loop."""
        return float("inf") if self.membership is None else self.membership.session_deadline()

    def identity(self) -> tuple[str | None, int | None]:
        """The member id and epoch commits carry; none for a standalone consumer."""
        return (None, None) if self.membership is None else self.membership.identity()

    def wake(self) -> None:
        """Heartbeat now rather than at the next interval: what the member reports changed
        (held keys released, a call that cannot be stopped is stuck)."""
        if self.membership is not None:
            self.membership.wake()

    def report_standbys(self, standbys: Slices) -> None:
        """Heartbeated at once when they changed; a standalone consumer has no one to tell."""
        if self.membership is not None:
            self.membership.report_standbys(standbys)

    def change_future(self) -> asyncio.Future[None]:
        """Resolved by the next ``notify``."""
        if self._changed is None or self._changed.done():
            self._changed = asyncio.get_running_loop().create_future()
        return self._changed

    def notify(self) -> None:
        """Wake waiters for an assignment: it changed, failed, or the consumer stops."""
        if self._changed is not None and not self._changed.done():
            self._changed.set_result(None)
