"""Topics whose partition counts this replica saw stored lately.

A heartbeat that carries a subscription (every join does) first makes sure the counts of its
topics are stored, reading them outside the group's lock (``heartbeat.learn_subscribed_topics``)
so that Kafka is never called under it. That read was a transaction of its own, three round
trips on the event loop in front of every join: at 10,000 waiting members they took up to half
a second at the tail, all of it on the join's hand-off
(bench/history/2026-11-27-issue-29-part-3-round-11.md). Counts, once stored,
stay stored until the metadata refresh finds a topic gone, and each replica's refresh reads
every stored count each interval. So the refresh and the learning read note what they saw
here, the refresh forgets what it removed, and a topic seen stored within the last two
refresh intervals is taken as stored without the read. When that is wrong (another replica's
refresh removed the topic since), the heartbeat's transaction finds no count and the topic
contributes nothing until a refresh stores it again: what a heartbeat does when Kafka cannot
be asked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable

# Topics remembered at most: a bound on memory against members subscribing to ever new names.
REMEMBERED_LIMIT = 65_536


class StoredTopics:
    """When each topic was last seen stored, forgotten after ``ttl_s``."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._seen: dict[str, float] = {}

    def all_stored(self, topics: Collection[str]) -> bool:
        """Whether every one of ``topics`` was seen stored within the interval."""
        oldest = self._clock() - self._ttl_s
        return all(self._seen.get(topic, oldest) > oldest for topic in topics)

    def forget(self, topics: Iterable[str]) -> None:
        """Note ``topics`` as no longer stored."""
        for topic in topics:
            self._seen.pop(topic, None)

    def remember(self, topics: Iterable[str]) -> None:
        """Note ``topics`` as stored now."""
        now = self._clock()
        for topic in topics:
            self._seen.pop(topic, None)
            self._seen[topic] = now
        while len(self._seen) > REMEMBERED_LIMIT:
            del self._seen[next(iter(self._seen))]
