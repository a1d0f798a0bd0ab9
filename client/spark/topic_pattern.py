"""``subscribePattern``: topics matched on RE2 with the coordinator's rules
(coordinator/core/topic_pattern.py), so a pattern selects the same topics for a Spark job as
for a worker's pattern subscription, in time linear in the topic name.

RE2 (the ``google-re2`` package) comes with the server extra; a job that uses a pattern
without it is refused with that reason instead of falling back to Python's backtracking
engine, whose answers differ on the syntax RE2 refuses.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import Any

# The coordinator's limit: a pattern over topic names needs a small fraction of it.
_MAX_PATTERN_MEMORY_BYTES = 8 << 20


class InvalidTopicPattern(ValueError):
    """A pattern RE2 cannot run, or RE2 is not installed; the message says why."""


@lru_cache(maxsize=64)
def compile_topic_pattern(pattern: str) -> Any:
    try:
        import re2
    except ImportError:
        raise InvalidTopicPattern(
            "option 'subscribePattern' is matched with RE2, as the coordinator does: "
            "pip install google-re2"
        ) from None
    options = re2.Options()
    options.log_errors = False
    options.max_mem = _MAX_PATTERN_MEMORY_BYTES
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "unsupported"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise InvalidTopicPattern(
            f"option 'subscribePattern' is not valid RE2 syntax ({reason}); back-references, "
            "look-around and possessive quantifiers are not supported"
        ) from None


def matching_topics(pattern: str, topics: Iterable[str]) -> set[str]:
    """The topics whose whole name ``pattern`` matches, as Kafka's pattern subscriptions
    (and Spark's ``subscribePattern``) do. ``topics`` is the cluster's list less Kafka's
    internal topics, as a consumer's metadata gives it."""
    compiled = compile_topic_pattern(pattern)
    return {topic for topic in topics if compiled.fullmatch(topic) is not None}
