"""The seeded fault plan: which fault, when, on what, for how long. The plan is a function of
the seed and the run's shape only, so ``--seed`` replays a failing run's faults."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from dataclasses import dataclass

MEMBER_KILL = "member_kill"
MEMBER_FREEZE = "member_freeze"
LOOP_BLOCK = "loop_block"
COORDINATOR_KILL = "coordinator_kill"
POSTGRES_STOP = "postgres_stop"
COORDINATOR_LINK = "coordinator_link"
BROKER_LINK = "broker_link"
# A few of a member's calls block past the revoke (drain) timeout while two new members
# join: the rebalance revokes part of the stuck member's keys.
STUCK_HANDLER = "stuck_handler"
# A member's call outlasts the processing timeout; once it timed out, the member leaves
# gracefully (and comes back later), so its key moves while the call still runs.
SLOW_CALLS = "slow_calls"
# SIGTERM (a graceful stop, the drain timeout short) while a call is long; restarted later.
SIGTERM_DRAIN = "sigterm_drain"
# A member joins for a while, then leaves gracefully.
SCALE_OUT = "scale_out"
# A member leaves gracefully, then comes back (a rolling restart).
SCALE_IN = "scale_in"
# Not a kind of its own: two faults of different kinds whose times overlap.
TWO_AT_ONCE = "two_at_once"

# Faults that stop a member's code mid-call: a handler running when they began may still be
# running when its keys are given away (a Kafka consumer frozen mid-call is no different).
FREEZING = frozenset({MEMBER_FREEZE, LOOP_BLOCK})
KINDS = (
    MEMBER_KILL,
    MEMBER_FREEZE,
    LOOP_BLOCK,
    COORDINATOR_KILL,
    POSTGRES_STOP,
    COORDINATOR_LINK,
    BROKER_LINK,
)
# Faults of a member; the others strike every member at once (a member joining strikes no
# one member's keys).
OF_A_MEMBER = frozenset(
    {
        MEMBER_KILL,
        MEMBER_FREEZE,
        LOOP_BLOCK,
        COORDINATOR_LINK,
        BROKER_LINK,
        STUCK_HANDLER,
        SLOW_CALLS,
        SIGTERM_DRAIN,
        SCALE_IN,
    }
)
# The faults added with the runtimes.
RUNTIME_KINDS = (STUCK_HANDLER, SLOW_CALLS, SIGTERM_DRAIN, SCALE_OUT, SCALE_IN)
EVERYONE = "*"


@dataclass(frozen=True)
class Fault:
    """``target`` is a member process's name, a coordinator replica's index, or ``*``;
    ``mode`` is how a link is cut (``drop`` or ``blackhole``)."""

    at_s: float
    kind: str
    target: str
    duration_s: float
    mode: str = ""
    # Faults of a ``TWO_AT_ONCE`` draw share its number, so a report can pair them.
    pair: int = 0


@dataclass(frozen=True)
class FaultRecord:
    """A fault as it happened, on the machine-wide monotonic clock the journals use."""

    kind: str
    target: str
    started: float
    ended: float
    # When the target's process exited, for a fault that ends one (a killed or stopped
    # member; a joining member's own graceful exit for ``SCALE_OUT``); None otherwise.
    exited: float | None = None
    pair: int = 0


def plan(
    seed: int,
    *,
    duration_s: float,
    members: int,
    replicas: int,
    session_s: float,
    kinds: tuple[str, ...] = KINDS,
    warmup_s: float = 4.0,
    cooldown_s: float = 6.0,
    extra_s: Mapping[str, float] | None = None,
) -> list[Fault]:
    """Faults one after another from ``warmup_s`` until ``cooldown_s`` before the end, each
    kind once in a shuffled round before any repeats (a short run still meets every kind), a
    pause of one to two sessions after each so its recovery can be measured on its own.

    ``TWO_AT_ONCE`` in ``kinds`` is a draw of two other kinds of the round, the second
    starting while the first lasts, on another member when both strike a member.
    ``extra_s`` lengthens a kind's faults by a fixed time (a call past the processing
    timeout first waits for the timeout)."""
    rng = random.Random(seed)
    extra = extra_s or {}

    def draw(kind: str, at: float) -> Fault:
        fault = _draw(rng, kind, at, members=members, replicas=replicas, session_s=session_s)
        return dataclasses.replace(fault, duration_s=fault.duration_s + extra.get(kind, 0.0))

    faults: list[Fault] = []
    bag: list[str] = []
    at = warmup_s + rng.uniform(0, session_s)
    pairs = 0
    single = tuple(kind for kind in kinds if kind != TWO_AT_ONCE)
    while True:
        if not bag:
            bag = list(kinds)
            rng.shuffle(bag)
        kind = bag.pop()
        if kind == TWO_AT_ONCE:
            pairs += 1
            first_kind, second_kind = rng.sample(single, 2)
            first = draw(first_kind, at)
            second = draw(second_kind, at + rng.uniform(0.1, 0.5) * first.duration_s)
            if second_kind in OF_A_MEMBER and first.target == second.target:
                other = (int(first.target[1:]) + 1 + rng.randrange(members - 1)) % members
                second = dataclasses.replace(second, target=f"m{other}")
            drawn = [dataclasses.replace(f, pair=pairs) for f in (first, second)]
        else:
            drawn = [draw(kind, at)]
        end = max(fault.at_s + fault.duration_s for fault in drawn)
        if end > duration_s - cooldown_s:
            return faults
        faults.extend(drawn)
        at = end + session_s * rng.uniform(1.5, 2.5)


def _draw(
    rng: random.Random, kind: str, at: float, *, members: int, replicas: int, session_s: float
) -> Fault:
    member = f"m{rng.randrange(members)}"
    if kind == MEMBER_KILL:
        return Fault(at, kind, member, rng.uniform(0.5, 2.0) * session_s)
    if kind in FREEZING:
        # Past the session, as a node freeze or a long GC pause meets a pod.
        return Fault(at, kind, member, rng.uniform(1.5, 3.0) * session_s)
    if kind == COORDINATOR_KILL:
        return Fault(at, kind, str(rng.randrange(replicas)), rng.uniform(0.25, 1.5) * session_s)
    if kind == POSTGRES_STOP:
        return Fault(at, kind, EVERYONE, rng.uniform(0.25, 1.5) * session_s)
    if kind in (STUCK_HANDLER, SCALE_OUT):
        # How long the joining member stays before it leaves again.
        return Fault(at, kind, member, rng.uniform(2.5, 4.0) * session_s)
    if kind in (SLOW_CALLS, SIGTERM_DRAIN, SCALE_IN):
        # How long the calls are slow, or the member is away.
        return Fault(at, kind, member, rng.uniform(1.0, 2.0) * session_s)
    return Fault(
        at, kind, member, rng.uniform(0.25, 2.0) * session_s, rng.choice(("drop", "blackhole"))
    )
