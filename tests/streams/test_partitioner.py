"""The sink producer's partitioner puts every keyed record where Kafka's default partitioner
(aiokafka's ``DefaultPartitioner``, the Java client's murmur2) puts it, remembered or not."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner

from client.streams.partitioner import RememberingPartitioner


def test_keys_land_where_the_default_partitioner_puts_them_before_and_after_the_memo() -> None:
    default = DefaultPartitioner()
    # A memo of 50 keys over 300: it fills and starts over several times.
    remembering = RememberingPartitioner(max_keys=50)
    keys = [b"key-%d" % index for index in range(300)] + [b"", b"\xff" * 17]
    for count in (1, 2, 3, 12, 7):
        partitions = list(range(count))
        for _ in range(2):
            for key in keys:
                assert remembering(key, partitions, partitions) == default(
                    key, partitions, partitions
                )


def test_a_record_without_a_key_goes_to_an_available_partition() -> None:
    remembering = RememberingPartitioner()
    chosen = {remembering(None, [0, 1, 2, 3], [1, 3]) for _ in range(200)}
    assert chosen == {1, 3}
