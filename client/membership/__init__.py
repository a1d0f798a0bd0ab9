"""Group membership through the coordinator's heartbeat endpoint (docs/design.md §5, docs/api.md).

Two long-lived tasks, one per concern. ``Membership`` heartbeats and publishes each reply's
``assignment`` (what the member may own *now*); ``Reconciler`` moves what the consumer owns
towards it. Keeping them apart lets the member keep heartbeating while a revocation drains
in-flight work.

The parts, one job each:

- ``heartbeat``: ``Membership``, the heartbeat loop and its pacing (intervals, waits for a
  change, wakes, refreshes, backoff, what a loss does);
- ``session``: the session deadline and loss detection, which the hand-out guard asks
  synchronously before every hand-out, and pool threads read as an instant;
- ``exchange``: the member's id and epoch, and the join, heartbeat and leave requests;
- ``reports``: the stuck calls and standby key ranges reported to the coordinator, and the
  idle reason logged;
- ``reconcile``: ``Reconciler`` and ``SliceOwner``, what the consumer exposes to it.
"""

from client.membership.heartbeat import Membership
from client.membership.reconcile import Reconciler, SliceOwner, slices_minus

__all__ = ["Membership", "Reconciler", "SliceOwner", "slices_minus"]
