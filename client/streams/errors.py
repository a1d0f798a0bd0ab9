"""The streams errors, under one root so callers catch them without string matching."""

from __future__ import annotations

from client.errors import KeyrangeClientError


class StreamsError(KeyrangeClientError):
    """Root of every error ``client.streams`` raises on purpose."""


class TopologyError(StreamsError, ValueError):
    """The topology is not valid; the message names the node (or store) at fault."""


class StoreKeyOutsideTask(StreamsError):
    """A store write for a key this task does not own: its state would land in the wrong
    task, and restoration by key range would never find it. Re-key through a topic first."""


class UnknownStore(StreamsError, KeyError):
    """A processor asked for a store it was not connected to."""


class ProcessorFailed(StreamsError):
    """A processor or punctuation raised: the application stops, and what the failing record
    produced is not committed (it is processed again after a restart)."""


class SendFailed(StreamsError):
    """The producer could not deliver a sink record or a changelog write: nothing processed
    since is committed, and the instance stops (Kafka Streams' at-least-once does the same),
    so whoever takes the keys processes those records again (docs/streams.md)."""


class ChangelogOutOfRange(StreamsError):
    """A restore's start offset is outside its changelog's log: the records below
    ``log_start`` were deleted (retention, deleted records) or the offset is past the log's
    end (the topic was created again). ``client.streams.restoring`` decides whether the
    restore may go on from ``log_start``."""

    def __init__(self, topic: str, partition: int, offset: int, log_start: int) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.log_start = log_start
        where = "below its log start" if offset < log_start else "past its end"
        super().__init__(
            f"cannot restore from changelog {topic}[{partition}]: offset {offset} is {where} "
            f"(log start {log_start})"
        )
