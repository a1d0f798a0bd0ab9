"""The protocol kernel holds both sides to one vocabulary: the error names each side knows,
the slice wire shape and the hash."""

from __future__ import annotations

from collections.abc import Iterator

from aiokafka.structs import ConsumerRecord, TopicPartition

from client.errors import ERROR_CLASSES, KeyrangeClientError, error_for_name
from client.http import slices_from_json, slices_to_json
from client.protocol import error_names as names
from client.protocol.keyspace import KeyRange, hash_records, key_hash
from coordinator.core.assignment import Slice, slices_from_wire, slices_to_wire
from coordinator.core.offsets import CommitOutcome
from coordinator.errors import KeyrangeError


def _subclasses(root: type[KeyrangeError]) -> Iterator[type[KeyrangeError]]:
    yield root
    for subclass in root.__subclasses__():
        yield from _subclasses(subclass)


def test_the_server_sends_exactly_the_kernels_problem_names() -> None:
    assert {cls.error for cls in _subclasses(KeyrangeError)} == names.PROBLEM_ERRORS


def test_commit_outcomes_are_the_kernels_partition_names() -> None:
    sent = {outcome.error_name for outcome in CommitOutcome} - {None}
    assert sent == names.PARTITION_ERRORS


def test_the_client_has_a_class_for_every_name_the_server_sends() -> None:
    assert set(ERROR_CLASSES) == names.PROBLEM_ERRORS | names.PARTITION_ERRORS
    for name, cls in ERROR_CLASSES.items():
        assert cls is not KeyrangeClientError
        assert error_for_name(name, 400) is cls
    # Named by docs/design.md §3, never sent: no class pretends the coordinator raises them.
    assert not names.NEVER_SENT & set(ERROR_CLASSES)
    assert not names.NEVER_SENT & (names.PROBLEM_ERRORS | names.PARTITION_ERRORS)


def test_both_sides_encode_slices_alike_and_read_each_other() -> None:
    half = KeyRange.full().split(2)
    server = (Slice("orders", 1, half[1]), Slice("orders", 0, half[0]), Slice("audit", 3, half[0]))
    client = {
        TopicPartition("orders", 0): [half[0]],
        TopicPartition("orders", 1): [half[1]],
        TopicPartition("audit", 3): [half[0]],
    }
    assert slices_to_wire(server) == slices_to_json(client)
    assert slices_from_json(slices_to_wire(server)) == client
    assert slices_from_wire(slices_to_json(client)) == tuple(sorted(server))


def test_batch_hashing_is_the_key_hash() -> None:
    records = [
        ConsumerRecord("t", 0, offset, 0, 0, key, b"", None, 0, 0, [])
        for offset, key in enumerate([b"alice", None, b"", b"bob", None])
    ]
    assert hash_records(records) == [key_hash(r.key, r.offset) for r in records]
