"""Reporting what a Spark job processed to the coordinator, after Spark finished it.

Streams report through ``KeyrangeCommitter``, a streaming query listener: Spark posts a
progress event for every micro-batch once the batch is in its commit log, including the
last batch of an ``availableNow`` run (the stream reader's own ``commit`` hook is only called
when a *next* batch is planned). A failed batch posts no progress, so it reports nothing.

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
    """Reports each finished micro-batch of every ``keyrange`` source to the coordinator.

    Register once per session with ``spark.streams.addListener``. Listener events arrive
    asynchronously, after ``awaitTermination`` may already have returned: ``await_query``
    waits until the query's last batch is reported, and raises if a report failed.
    """

    def __init__(self, coordinator_url: str, token: str | None = None) -> None:
        self._coordinator_url = coordinator_url
        self._token = token
        self._lock = threading.Lock()
        self._terminated: dict[str, threading.Event] = {}
        self._failures: dict[str, list[str]] = {}
        self._reported: dict[tuple[str, int], str] = {}

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        self._terminated_event(str(event.id))

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        progress = event.progress
        query_id = str(progress.id)
        for index, source in enumerate(progress.sources):
            end = source.endOffset
            with self._lock:
                if self._reported.get((query_id, index)) == end:
                    continue
            try:
                self._report(end)
            except Exception as error:
                logger.exception(
                    "could not report a finished batch",
                    extra={"query": query_id, "batch": progress.batchId},
                )
                with self._lock:
                    self._failures.setdefault(query_id, []).append(
                        f"{type(error).__name__}: {error}"
                    )
                continue
            with self._lock:
                self._reported[(query_id, index)] = end

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        """Idle triggers process nothing, so there is nothing to report."""

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        self._terminated_event(str(event.id)).set()

    def await_query(self, query: StreamingQuery, timeout_s: float = 60.0) -> None:
        """Wait for ``query`` to stop and its batches to be reported; raise if one was not.

        A query that failed raises its own exception, after the reports of the batches that
        finished before the failure are done.
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
