"""Topic subscription patterns (``subscribed_topic_regex``): the one place they are compiled
and matched, on RE2.

A pattern comes from any client and runs on the coordinator's event loop against every topic
of the cluster, at the join, at every rebalance and at every metadata refresh. Python's
backtracking engine takes exponential time on patterns such as ``([\\w.-]|[\\w.-])*!``, so
one team's pattern could stall every other team's requests. RE2 matches in time linear in the
topic name whatever the pattern, and refuses at compile time what it cannot run that way
(back-references, look-around, possessive quantifiers, counted repetitions above 1000).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

import re2

# RE2 stops compiling a pattern whose automaton would need more than this; a subscription
# pattern of at most 1,000 characters over topic names needs a small fraction of it.
_MAX_PATTERN_MEMORY_BYTES = 8 << 20


class InvalidTopicPattern(ValueError):
    """A pattern RE2 cannot run; the message says why."""


def _options() -> re2.Options:
    options = re2.Options()
    # Refusals are answered to the client; RE2 printing them to stderr would let any client
    # write to the coordinator's log at will.
    options.log_errors = False
    options.max_mem = _MAX_PATTERN_MEMORY_BYTES
    return options


@lru_cache(maxsize=1024)
def compile_topic_pattern(pattern: str) -> re2._Regexp[str]:
    """The compiled pattern, cached: the same few patterns are matched on every pass."""
    try:
        return re2.compile(pattern, _options())
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "unsupported"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise InvalidTopicPattern(
            f"subscribed_topic_regex is not valid RE2 syntax ({reason}); back-references, "
            "look-around and possessive quantifiers are not supported"
        ) from None


def matching_topics(pattern: str, topics: Iterable[str]) -> set[str]:
    """The topics whose whole name ``pattern`` matches, as Kafka's regex subscriptions do.

    A pattern stored before subscriptions ran on RE2 may be one RE2 refuses; it matches no
    topic rather than failing the group's rebalance (the member's next join is refused with
    the reason)."""
    try:
        compiled = compile_topic_pattern(pattern)
    except InvalidTopicPattern:
        return set()
    return {topic for topic in topics if compiled.fullmatch(topic) is not None}
