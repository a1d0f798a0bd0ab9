"""The partitioner of sink records (``client.streams.outputs`` asks it, since it hands the
producer whole batches of one partition): Kafka's default (murmur2 of the key, as aiokafka's
``DefaultPartitioner`` and the Java client compute it, so records land where any Kafka client
would put them), with each key's hash remembered.

aiokafka computes murmur2 in Python, about 7% of the word count's CPU in ``rate_cpu_1``
(bench/history/2026-11-26-issue-30-rate-cpu-record-cache.md): a stream's keys repeat
(words, users, customers), so the hash of a key
seen before is a dict look-up. The hash, not the partition, is kept, so a topic whose
partition count grows is partitioned as the default partitioner does it. At most
``max_keys`` hashes are kept; when full the memo starts over (a scan of a key space larger
than that costs one extra dict insert per record, nothing more).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from aiokafka.partitioner import murmur2

_POSITIVE = 0x7FFFFFFF


class RememberingPartitioner:
    def __init__(self, max_keys: int = 65_536) -> None:
        self._max_keys = max_keys
        self._hashes: dict[bytes, int] = {}

    def __call__(
        self, key: bytes | None, all_partitions: Sequence[int], available: Sequence[int]
    ) -> int:
        if key is None:
            # As the default partitioner: a random available partition.
            return random.choice(available or all_partitions)
        if len(all_partitions) == 1:
            return all_partitions[0]
        hashed = self._hashes.get(key)
        if hashed is None:
            if len(self._hashes) >= self._max_keys:
                self._hashes.clear()
            hashed = self._hashes[key] = murmur2(key) & _POSITIVE
        return all_partitions[hashed % len(all_partitions)]
