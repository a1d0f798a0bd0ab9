"""Reporting what a Spark job processed to the coordinator, after Spark finished it.

Streams report from the stream reader itself (client/spark/source.py), at the trigger after
a batch is in the checkpoint's commit log. ``KeyrangeCommitter``, the listener of the
explicit calls, adds the one report that path cannot make: the last batch of a query
stopped (``query.stop()``) before another trigger ran. A failed batch posts no progress, so
neither reports it.

Spark commits as a standalone consumer (no member id, docs/design.md §3.7). Reports are idempotent:
a replayed batch, or a report that repeats an earlier one, changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Mapping
from typing import Any

from aiokafka.structs import TopicPartition
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)
from pyspark.sql.streaming.query import StreamingQuery

from client.errors import KeyrangeClientError
from client.http import CoordinatorClient, PartitionCommitReply
from client.protocol import error_names as names
from client.spark.planning import Position, group_of, is_stream_offset, plan_commits, positions_of

logger = logging.getLogger(__name__)


class CommitFailed(KeyrangeClientError):
    """A finished batch could not be reported; the next report covers it again."""


async def commit_positions(
    coordinator_url: str,
    token: str | None,
    group: str,
    positions: Mapping[TopicPartition, Position],
) -> list[PartitionCommitReply]:
    """Report every record of ``[origin, next)`` of each partition as processed."""
    async with CoordinatorClient(coordinator_url, token=token) as api:
        committed = await api.fetch_offsets(group, topics=sorted({tp.topic for tp in positions}))
        commits = plan_commits(positions, committed)
        if not commits:
            return []
        replies = await api.commit(group, commits)
    for reply in replies:
        if reply.error == names.MAX_INDIVIDUAL_COMMIT_REACHED:
            logger.warning(
                "coordinator refused more IC ranges for a partition",
                extra={"group": group, "topic": reply.topic, "partition": reply.partition},
            )
    logger.debug(
        "reported processed offsets",
        extra={"group": group, "partitions": len(commits)},
    )
    return replies


class KeyrangeCommitter(StreamingQueryListener):
    """Optional since the source reports by itself: reports, when a query stops, the last
    batch it finished, which a query stopped between triggers has not reported yet, and
    lets ``await_query`` raise if that report failed.

    Register once per session with ``enable_commits``. Listener events arrive
    asynchronously, after ``awaitTermination`` may already have returned: ``await_query``
    waits until the query's termination is handled.
    """

    def __init__(self, coordinator_url: str, token: str | None = None) -> None:
        self._coordinator_url = coordinator_url
        self._token = token
        self._lock = threading.Lock()
        self._terminated: dict[str, threading.Event] = {}
        self._failures: dict[str, list[str]] = {}
        self._last_ends: dict[str, list[str]] = {}

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        self._terminated_event(str(event.id))

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        progress = event.progress
        with self._lock:
            self._last_ends[str(progress.id)] = [source.endOffset for source in progress.sources]

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        """Idle triggers process nothing, so there is nothing to report."""

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        query_id = str(event.id)
        with self._lock:
            ends = self._last_ends.pop(query_id, [])
        for end in ends:
            try:
                self._report(end)
            except Exception as error:
                logger.exception("could not report a finished batch", extra={"query": query_id})
                with self._lock:
                    self._failures.setdefault(query_id, []).append(
                        f"{type(error).__name__}: {error}"
                    )
        self._terminated_event(query_id).set()

    def await_query(self, query: StreamingQuery, timeout_s: float = 60.0) -> None:
        """Wait for ``query`` to stop and its last batch to be reported; raise if it was not.

        A query that failed raises its own exception, after the report of the last batch
        that finished before the failure is done.
        """
        query_id = str(query.id)
        try:
            query.awaitTermination()
        finally:
            if not self._terminated_event(query_id).wait(timeout_s):
                raise TimeoutError(f"no termination event for query {query_id} in {timeout_s}s")
        with self._lock:
            failures = self._failures.pop(query_id, [])
        if failures:
            raise CommitFailed("; ".join(failures))

    def _terminated_event(self, query_id: str) -> threading.Event:
        with self._lock:
            return self._terminated.setdefault(query_id, threading.Event())

    def _report(self, end_offset: str) -> None:
        try:
            document: Any = json.loads(end_offset)
        except (TypeError, ValueError):
            return  # another source's offset, in a format of its own
        if not is_stream_offset(document):
            return
        group = group_of(document)
        if group is None:
            return
        asyncio.run(
            commit_positions(self._coordinator_url, self._token, group, positions_of(document))
        )
