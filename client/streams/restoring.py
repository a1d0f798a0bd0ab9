"""A task's restore of one store, carried on until it finishes or saying why it cannot.

A restore that fails is logged as an ERROR naming the task, the store, the changelog and the
offsets, counted in the store's ``RestoreProgress`` (``failures``, and ``error`` until an
attempt succeeds: ``StreamsApp.metrics()`` and the metrics port show both), and tried again
from where the store's state then stands, after a backoff that doubles up to a minute. The
task stays RESTORING meanwhile, its records buffered, so the byte budget may pause its
partition: the ERROR and the metric say why.

A start offset outside the changelog's log (Kafka's OffsetOutOfRange) is not a failure when
the records that are gone could only be ones the store no longer needs:

- below the log start, in a changelog whose records expire by time (a window store's, with
  ``cleanup.policy=delete``: what was deleted held only expired windows) or in a source
  topic read as a table (the topic is the table, whatever its policy dropped);
- past the log's end, in any changelog: the topic was created again, so no local state of
  the range is of the log there is now.

Then the range's local state is deleted and restored from the log start, with a WARNING. A
compacted changelog of the application's own whose first records were deleted lost values
of live keys: restoring what is left would silently forget them, so that restore fails as
above and names the offsets.

A source-topic table restores only up to where its task's processing of the topic starts
(``StoreRestore.starts``, per part of the range), as Kafka Streams restores it to the
committed offset: the later records are the task's input, applied in timestamp order with
the stream's, so a replayed stream record never joins a later table value. Local state
already past that position is restored anew (``_past_committed``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from client.protocol.keyspace import KeyRange
from client.streams.errors import ChangelogOutOfRange
from client.streams.ports import StoreRestorer
from client.streams.restore import RestoreProgress
from client.streams.state import StateManager
from client.streams.topology import StoreSpec

logger = logging.getLogger(__name__)

# The first wait before a failed restore is tried again, doubled after each failure up to
# the last: a broker back within seconds is caught soon, one down for long is not hammered.
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0


@dataclass(frozen=True, slots=True)
class StoreRestore:
    """One store of one task to restore: which keys of which changelog partition."""

    task: str
    application_id: str
    store: str
    spec: StoreSpec
    partition: int
    keys: KeyRange
    # A source-topic table's: where the task's processing of the topic starts, per part of
    # ``keys`` (None: no position known, the restore reads to the high watermark).
    starts: tuple[tuple[KeyRange, int], ...] | None = None

    @property
    def changelog(self) -> str:
        return self.spec.changelog_topic(self.application_id)

    @property
    def prefix_may_expire(self) -> bool:
        """Whether records at the changelog's start may be gone without the store missing
        them: a window store's changelog expires by time, a source topic is the table."""
        return self.spec.windowed or self.spec.source_topic is not None


async def restore_store(
    job: StoreRestore,
    progress: RestoreProgress,
    restorer: StoreRestorer,
    state: StateManager,
    on_progress: Callable[[RestoreProgress], None],
) -> None:
    """Restore ``job`` into its backend, recording each attempt in ``progress``; returns once
    an attempt succeeds (cancelled with the task). Each attempt starts where the range's
    state stands (``StateManager.restore_from``; opening the store is part of the attempt),
    except one going on from the log start."""
    backoff = FIRST_BACKOFF_S
    from_log_start: int | None = None
    while True:
        try:
            local = from_log_start is None
            progress.start_offset = (
                state.restore_from(job.store, job.partition, job.keys)
                if from_log_start is None
                else from_log_start
            )
            from_log_start = None
            # Only local state can be ahead: a log start past the position is records gone.
            if local and job.starts is not None and progress.start_offset > _lowest(job.starts):
                _past_committed(job, progress.start_offset, state)
                from_log_start = 0
                continue
            await _restore_stages(job, progress, restorer, state, on_progress)
            progress.error = None
            return
        except ChangelogOutOfRange as gone:
            if _from_log_start(job, gone):
                state.restart(job.application_id, job.store, job.partition, job.keys)
                from_log_start = gone.log_start
                continue
            failure: Exception = gone
        except Exception as error:  # any failure is reported and retried
            failure = error
        progress.failures += 1
        progress.error = str(failure)
        logger.error(
            "store restore failed; retried",
            extra={
                "task": job.task,
                "store": job.store,
                "changelog": job.changelog,
                "partition": job.partition,
                "start_offset": progress.start_offset,
                "position": progress.position,
                "end_offset": progress.end_offset,
                "failures": progress.failures,
                "retry_in_s": backoff,
                "error": str(failure),
            },
        )
        await asyncio.sleep(backoff)
        backoff = min(2 * backoff, MAX_BACKOFF_S)


async def _restore_stages(
    job: StoreRestore,
    progress: RestoreProgress,
    restorer: StoreRestorer,
    state: StateManager,
    on_progress: Callable[[RestoreProgress], None],
) -> None:
    """Restore ``job``: to the high watermark, or, for a source-topic table, each part of its
    keys up to where its processing starts, in one pass over the log (from one start to the
    next, the parts not yet at theirs). The records from there are the task's input, which
    the ``TableSource`` applies in order with the other input, as Kafka Streams does."""
    backend = state.backend(job.store, job.partition)
    if job.starts is None:
        await restorer.restore(job.changelog, progress, backend, on_progress)
        return
    position = progress.start_offset
    for end in sorted({offset for _, offset in job.starts}):
        if end <= position:
            continue
        progress.ranges = [keys for keys, offset in job.starts if offset >= end]
        progress.start_offset = position
        progress.stop_at = end
        await restorer.restore(job.changelog, progress, backend, on_progress)
        position = end
    progress.ranges = [job.keys]
    # The checkpoint's rule: every record of the range below it is in the store.
    progress.position = _lowest(job.starts)


def _lowest(starts: tuple[tuple[KeyRange, int], ...]) -> int:
    return min(offset for _, offset in starts)


def _past_committed(job: StoreRestore, offset: int, state: StateManager) -> None:
    """The range's local state of a source-topic table holds the topic up to ``offset``
    (a checkpoint, a standby or the range kept from a task split), past where processing
    starts for some of its keys: it may hold values later than the records the task
    processes next. Deleted and restored from the log start: a checkpoint capped at the
    start would still leave those values in the store."""
    logger.warning(
        "source-topic table's local state is past the committed position: the range is "
        "restored from the log start",
        extra={
            "task": job.task,
            "store": job.store,
            "changelog": job.changelog,
            "partition": job.partition,
            "offset": offset,
            "committed": _lowest(job.starts or ()),
        },
    )
    state.restart(job.application_id, job.store, job.partition, job.keys)


def _from_log_start(job: StoreRestore, gone: ChangelogOutOfRange) -> bool:
    """Whether the restore goes on from the log start (the module's rules), saying so."""
    past_end = gone.offset >= gone.log_start
    if gone.offset == gone.log_start or not (past_end or job.prefix_may_expire):
        return False
    logger.warning(
        "changelog offset outside its log: the range's local state is deleted and restored "
        "from the log start",
        extra={
            "task": job.task,
            "store": job.store,
            "changelog": job.changelog,
            "partition": job.partition,
            "offset": gone.offset,
            "log_start": gone.log_start,
            "reason": "past the log end (topic created again)"
            if past_end
            else "records below the log start expired",
        },
    )
    return True
