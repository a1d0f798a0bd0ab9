"""``auto_offset_reset`` for slices whose read position lies outside the partition's log, as
Kafka's consumer applies it on ``OFFSET_OUT_OF_RANGE`` (docs/offsets.md, "Offsets outside the
log").

The fetcher finds such a partition; this part warns once (group, partition, the position and
the log's bounds), asks the coordinator to move a stored state that is past the log end (the
coordinator checks the log end itself and leaves a state a fellow member reset already), and
starts the partition's slices over from the group's state afterwards, or from the reset
position where that state is still outside the log (a position below the log start: records
deleted by retention). With ``"none"`` it raises ``OffsetOutOfRange`` to the caller instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiokafka.structs import TopicPartition

from client.errors import (
    FencedMemberEpoch,
    KeyrangeClientError,
    OffsetOutOfRange,
    UnknownMemberId,
)
from client.fetcher import Fetcher, OutsideLog
from client.http import CoordinatorClient, Slices
from client.protocol.committed import CommittedOffsets
from client.protocol.keyspace import KeyRange
from client.protocol.log_bounds import OffsetReset, out_of_range, past_log_end, reset_position
from client.tracker import OffsetTracker

logger = logging.getLogger(__name__)

Identity = Callable[[], tuple[str | None, int | None]]


class OutsideLogReset:
    """Applies one consumer's reset policy; ``identity`` is its member id and epoch (both None
    when standalone); ``revoking`` (the lifecycle hooks' fan-out) drops what the consumer's
    parts hold of restarted slices, as for a revocation, before they are read again from the
    reset position."""

    def __init__(
        self,
        client: CoordinatorClient,
        group_id: str,
        tracker: OffsetTracker,
        fetcher: Fetcher,
        policy: OffsetReset,
        *,
        identity: Identity,
        revoking: Callable[[Slices], None],
    ) -> None:
        self._client = client
        self._group_id = group_id
        self._tracker = tracker
        self._fetcher = fetcher
        self._policy = policy
        self._identity = identity
        self._revoking = revoking
        # (partition, position, high watermark) already reported: a retried reset or a policy
        # of "none" raising at every poll does not repeat the warning.
        self._warned: set[tuple[TopicPartition, int, int]] = set()

    async def apply(self, outside: list[OutsideLog]) -> None:
        starts = await self._fetcher.kafka().beginning_offsets([found.tp for found in outside])
        log_starts = {tp: int(offset) for tp, offset in starts.items()}
        for found in outside:
            self._warn(found, log_starts[found.tp])
        targets: dict[TopicPartition, int] = {}
        for found in outside:
            target = reset_position(self._policy, log_starts[found.tp], found.high_watermark)
            if target is None:
                raise OffsetOutOfRange(
                    f"group '{self._group_id}': {_describe(found, log_starts[found.tp])}, and "
                    "auto_offset_reset is 'none'"
                )
            targets[found.tp] = target
        member_id, member_epoch = self._identity()
        try:
            states = await self._client.reset_out_of_range(
                self._group_id, targets, member_id=member_id, member_epoch=member_epoch
            )
        except KeyrangeClientError as error:
            if not (error.retriable or isinstance(error, FencedMemberEpoch | UnknownMemberId)):
                raise
            # The next poll finds the partition outside its log again and retries; a fenced
            # member retries once its membership rejoined (or its slices moved on).
            logger.warning(
                "resetting offsets outside the log failed; retrying",
                extra={"group_id": self._group_id, "error": str(error)},
            )
            return
        for found in outside:
            state = states.get(found.tp)
            if state is not None and past_log_end(state, found.high_watermark):
                raise OffsetOutOfRange(
                    f"the coordinator kept {found.tp.topic}[{found.tp.partition}] of group "
                    f"'{self._group_id}' at offset {state.stable_offset}, past the log end "
                    f"{found.high_watermark} this consumer reads: does the coordinator read "
                    "another Kafka cluster, or none?"
                )
        async with self._fetcher.lock:
            restarted: Slices = {}
            for found in outside:
                restarted[found.tp] = self._tracker.restart(
                    found.tp,
                    _positions(
                        states.get(found.tp),
                        targets[found.tp],
                        log_starts[found.tp],
                        found.high_watermark,
                    ),
                    states.get(found.tp),
                )
            self._revoking(restarted)
            self._fetcher.sync(seek=restarted)

    def _warn(self, found: OutsideLog, log_start: int) -> None:
        key = (found.tp, found.position, found.high_watermark)
        if key in self._warned:
            return
        self._warned.add(key)
        logger.warning(
            "%s; applying auto_offset_reset=%s",
            _describe(found, log_start),
            self._policy,
            extra={
                "group_id": self._group_id,
                "topic": found.tp.topic,
                "partition": found.tp.partition,
                "position": found.position,
                "log_start": log_start,
                "high_watermark": found.high_watermark,
                "auto_offset_reset": self._policy,
            },
        )


def _positions(
    state: CommittedOffsets | None, target: int, log_start: int, high_watermark: int
) -> Callable[[KeyRange], int]:
    """Where a restarted slice reads from: the group's position for its keys, unless that is
    still outside the log (then the reset position)."""

    def position_of(keys: KeyRange) -> int:
        position = target if state is None else state.min_watermark(keys)
        return target if out_of_range(position, log_start, high_watermark) else position

    return position_of


def _describe(found: OutsideLog, log_start: int) -> str:
    where = f"{found.tp.topic}[{found.tp.partition}]"
    if found.position > found.high_watermark:
        return (
            f"read position {found.position} of {where} is past its log end (high watermark "
            f"{found.high_watermark})"
        )
    return (
        f"read position {found.position} of {where} is below its log start {log_start} "
        f"(records deleted; high watermark {found.high_watermark})"
    )
