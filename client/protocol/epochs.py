"""Member epochs of the heartbeat (docs/design.md §5): what a request's ``member_epoch``
asks for."""

from __future__ import annotations

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
# A new member's epoch; each revocation and each rejoin in place bumps it.
FIRST_MEMBER_EPOCH = 1
