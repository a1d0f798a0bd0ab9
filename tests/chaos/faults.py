"""The seeded fault plan: which fault, when, on what, for how long. The plan is a function of
the seed and the run's shape only, so ``--seed`` replays a failing run's faults."""

from __future__ import annotations

import random
from dataclasses import dataclass

MEMBER_KILL = "member_kill"
MEMBER_FREEZE = "member_freeze"
LOOP_BLOCK = "loop_block"
COORDINATOR_KILL = "coordinator_kill"
POSTGRES_STOP = "postgres_stop"
COORDINATOR_LINK = "coordinator_link"
BROKER_LINK = "broker_link"

# Faults that stop a member's code mid-call: a handler running when they began may still be
# running when its keys are given away (a Kafka consumer frozen mid-call is no different).
FREEZING = frozenset({MEMBER_FREEZE, LOOP_BLOCK})
# Faults of one member; the others strike every member at once.
OF_A_MEMBER = frozenset({MEMBER_KILL, MEMBER_FREEZE, LOOP_BLOCK, COORDINATOR_LINK, BROKER_LINK})
KINDS = (
    MEMBER_KILL,
    MEMBER_FREEZE,
    LOOP_BLOCK,
    COORDINATOR_KILL,
    POSTGRES_STOP,
    COORDINATOR_LINK,
    BROKER_LINK,
)
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


@dataclass(frozen=True)
class FaultRecord:
    """A fault as it happened, on the machine-wide monotonic clock the journals use."""

    kind: str
    target: str
    started: float
    ended: float


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
) -> list[Fault]:
    """Faults one after another from ``warmup_s`` until ``cooldown_s`` before the end, each
    kind once in a shuffled round before any repeats (a short run still meets every kind), a
    pause of one to two sessions after each so its recovery can be measured on its own."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    bag: list[str] = []
    at = warmup_s + rng.uniform(0, session_s)
    while True:
        if not bag:
            bag = list(kinds)
            rng.shuffle(bag)
        kind = bag.pop()
        fault = _draw(rng, kind, at, members=members, replicas=replicas, session_s=session_s)
        if fault.at_s + fault.duration_s > duration_s - cooldown_s:
            return faults
        faults.append(fault)
        at = fault.at_s + fault.duration_s + session_s * rng.uniform(1.5, 2.5)


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
    return Fault(
        at, kind, member, rng.uniform(0.25, 2.0) * session_s, rng.choice(("drop", "blackhole"))
    )
