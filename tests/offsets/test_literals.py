"""The commit batch's write literals formatted in C (``coordinator.offsets._literals``) against
the Python formatting, which stays the reference, on random batches."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client.protocol.committed import CommittedOffsets
from coordinator.offsets import _literals
from coordinator.offsets.literals import GroupPartitionKey, write_literals_in_python
from tests.core.test_commit_native import stored_states

# Names and metadata with what the literals must escape: quotes, backslashes, commas, braces,
# the word NULL, and characters outside ASCII.
texts = st.text(
    alphabet=st.sampled_from(['"', "\\", "'", ",", "{", "}", " ", "a", "N", "U", "L", "é", "😀"]),
    max_size=6,
)


@st.composite
def batches(draw: st.DrawFn) -> dict[GroupPartitionKey, CommittedOffsets]:
    keys = draw(st.sets(st.tuples(texts, texts, st.integers(0, 2**31 - 1)), min_size=1, max_size=6))
    batch = {}
    for key in keys:
        state = draw(stored_states())
        metadata = draw(st.none() | texts)
        batch[key] = CommittedOffsets.of_pieces(
            state.stable_offset, state.ranges, state.pieces, metadata
        )
    return batch


@settings(max_examples=500, deadline=None)
@given(batches())
def test_the_c_literals_are_the_python_literals(
    batch: dict[GroupPartitionKey, CommittedOffsets],
) -> None:
    ordered = sorted(batch)
    expected = asyncio.run(write_literals_in_python(ordered, batch))
    literals, ranges_texts = _literals.write_literals(ordered, [batch[key] for key in ordered])
    assert (literals, ranges_texts) == expected


def test_keys_and_states_of_different_lengths_are_refused() -> None:
    with pytest.raises(TypeError, match="two lists of one length"):
        _literals.write_literals([("g", "t", 0)], [])
