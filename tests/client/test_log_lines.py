"""What the SDK's logs say about slices: one line per partition a person can read, not a
Python repr of ranges."""

from __future__ import annotations

from aiokafka.structs import TopicPartition

from client.protocol.keyspace import KeyRange
from client.release import describe


def test_slices_read_as_partitions_with_their_keys_and_share() -> None:
    slices = {
        TopicPartition("orders", 0): [KeyRange.full()],
        TopicPartition("orders", 3): [KeyRange(0, 2**61 - 1), KeyRange(2**61 * 3, 2**63 - 1)],
    }
    spans = "[0, 2305843009213693951], [6917529027641081856, 9223372036854775807]"
    assert describe(slices) == ["orders[0] all keys", f"orders[3] keys {spans} (50%)"]
