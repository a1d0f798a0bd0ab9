from __future__ import annotations

from aiokafka.structs import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from client.http import PartitionCommitReply
from client.protocol.committed import CommittedOffsets, Watermark
from client.protocol.keyspace import HASH_MAX, KeyRange
from client.tracker import CommitBatch, CommitMode, OffsetTracker

TP = TopicPartition("orders", 0)
LOW, HIGH = KeyRange(0, HASH_MAX // 2), KeyRange(HASH_MAX // 2 + 1, HASH_MAX)
LOW_HASH, HIGH_HASH = 7, HASH_MAX - 7


def ok(batch: CommitBatch, stable_offset: int = 0) -> list[PartitionCommitReply]:
    return [
        PartitionCommitReply(p.topic, p.partition, None, stable_offset) for p in batch.partitions
    ]


def feed(tracker: OffsetTracker, hashes: dict[int, int]) -> list[int]:
    accepted = [o for o, h in sorted(hashes.items()) if tracker.accept(TP, o, h)]
    tracker.advance(TP, max(hashes) + 1)
    return accepted


def design_example(tracker: OffsetTracker) -> list[int]:
    """docs/design.md §3: LSO 40, IC [43-45],[48-49], fetched [40..50], 40 belongs to
    another slice."""
    committed = CommittedOffsets(stable_offset=40, ranges=((43, 45), (48, 49)))
    tracker.add_slice(TP, LOW, position=40, committed=committed)
    hashes = {offset: LOW_HASH for offset in range(41, 51)} | {40: HIGH_HASH}
    accepted = feed(tracker, hashes)
    for offset in accepted:
        tracker.mark_processed(TP, offset, LOW_HASH)
    return accepted


def test_gap_amending_commits_only_the_processed_offsets_it_was_given() -> None:
    tracker = OffsetTracker(mode="ranges")
    assert design_example(tracker) == [41, 42, 46, 47, 50]
    batch = tracker.prepare_commit()
    assert batch is not None
    [entry] = batch.partitions
    assert list(entry.ranges) == [(41, 42), (46, 47), (50, 50)]
    assert not entry.watermarks


def test_in_order_processing_commits_one_watermark_and_no_ranges() -> None:
    tracker = OffsetTracker()
    design_example(tracker)
    batch = tracker.prepare_commit()
    assert batch is not None
    [entry] = batch.partitions
    assert list(entry.watermarks) == [Watermark(LOW, 51)]
    assert not entry.ranges


def test_each_owned_slice_gets_its_own_watermark_at_its_lowest_in_flight_offset() -> None:
    tracker = OffsetTracker()
    tracker.add_slice(TP, LOW, position=0)
    tracker.add_slice(TP, HIGH, position=0)
    hashes = {0: LOW_HASH, 1: HIGH_HASH, 2: LOW_HASH, 3: HIGH_HASH, 4: LOW_HASH}
    feed(tracker, hashes)
    tracker.mark_processed(TP, 0, LOW_HASH)
    tracker.mark_processed(TP, 1, HIGH_HASH)
    tracker.mark_processed(TP, 3, HIGH_HASH)
    batch = tracker.prepare_commit()
    assert batch is not None
    [entry] = batch.partitions
    assert list(entry.watermarks) == [Watermark(LOW, 2), Watermark(HIGH, 5)]
    assert not entry.ranges


def test_out_of_order_completion_is_an_ic_range_above_the_watermark() -> None:
    tracker = OffsetTracker()
    tracker.add_slice(TP, LOW, position=0)
    feed(tracker, dict.fromkeys(range(10), LOW_HASH))
    for offset in (0, 1, 5, 6, 8):
        tracker.mark_processed(TP, offset, LOW_HASH)
    batch = tracker.prepare_commit()
    assert batch is not None
    [entry] = batch.partitions
    assert list(entry.watermarks) == [Watermark(LOW, 2)]
    assert list(entry.ranges) == [(5, 6), (8, 8)]


def test_ic_ranges_never_bridge_offsets_of_another_slice() -> None:
    tracker = OffsetTracker()
    tracker.add_slice(TP, LOW, position=0)
    feed(tracker, {0: LOW_HASH, 1: LOW_HASH, 2: HIGH_HASH, 3: LOW_HASH})
    tracker.mark_processed(TP, 1, LOW_HASH)
    tracker.mark_processed(TP, 3, LOW_HASH)
    assert tracker.uncommitted_ranges == 2
    batch = tracker.prepare_commit()
    assert batch is not None
    assert list(batch.partitions[0].ranges) == [(1, 1), (3, 3)]


def test_ranges_that_the_watermark_overtakes_are_no_longer_committed() -> None:
    tracker = OffsetTracker()
    tracker.add_slice(TP, LOW, position=0)
    feed(tracker, dict.fromkeys(range(4), LOW_HASH))
    tracker.mark_processed(TP, 2, LOW_HASH)
    tracker.mark_processed(TP, 3, LOW_HASH)
    assert tracker.uncommitted_ranges == 1
    tracker.mark_processed(TP, 1, LOW_HASH)
    tracker.mark_processed(TP, 0, LOW_HASH)
    assert tracker.uncommitted_ranges == 0
    batch = tracker.prepare_commit()
    assert batch is not None
    assert list(batch.partitions[0].watermarks) == [Watermark(LOW, 4)]
    assert not batch.partitions[0].ranges


def test_uncommitted_range_count_reaches_the_early_commit_threshold() -> None:
    tracker = OffsetTracker(mode="ranges")
    tracker.add_slice(TP, LOW, position=0)
    feed(tracker, dict.fromkeys(range(0, 40), LOW_HASH))
    for offset in range(0, 40, 2):
        tracker.mark_processed(TP, offset, LOW_HASH)
    assert tracker.uncommitted_ranges == 20
    tracker.mark_processed(TP, 1, LOW_HASH)  # joins [0,0] and [2,2]
    assert tracker.uncommitted_ranges == 19
    batch = tracker.prepare_commit(max_ranges=5)
    assert batch is not None
    assert list(batch.partitions[0].ranges) == [(0, 2), (4, 4), (6, 6), (8, 8), (10, 10)]
    tracker.commit_succeeded(batch, ok(batch))
    assert tracker.uncommitted_ranges == 14


def test_committed_state_is_not_sent_again_but_new_progress_is() -> None:
    tracker = OffsetTracker()
    tracker.add_slice(TP, LOW, position=0)
    feed(tracker, dict.fromkeys(range(3), LOW_HASH))
    tracker.mark_processed(TP, 0, LOW_HASH)
    tracker.mark_processed(TP, 2, LOW_HASH)
    first = tracker.prepare_commit()
    assert first is not None
    tracker.mark_processed(TP, 1, LOW_HASH)  # lands while the commit is in flight
    tracker.commit_succeeded(first, ok(first))
    second = tracker.prepare_commit()
    assert second is not None
    assert list(second.partitions[0].watermarks) == [Watermark(LOW, 3)]
    assert not second.partitions[0].ranges
    tracker.commit_succeeded(second, ok(second))
    assert tracker.prepare_commit() is None


def test_a_reply_drops_local_state_below_the_stable_offset() -> None:
    tracker = OffsetTracker(mode="ranges")
    tracker.add_slice(TP, LOW, position=0)
    feed(tracker, dict.fromkeys(range(10), LOW_HASH))
    for offset in (3, 4, 8):
        tracker.mark_processed(TP, offset, LOW_HASH)
    batch = tracker.prepare_commit()
    assert batch is not None
    tracker.mark_processed(TP, 6, LOW_HASH)
    tracker.commit_succeeded(batch, ok(batch, stable_offset=7))
    [progress] = tracker.slices_of(TP)
    assert min(progress.pending_offsets) == 7
    assert tracker.uncommitted_ranges == 0
    assert not tracker.accept(TP, 5, LOW_HASH)


def test_a_refused_partition_stays_uncommitted() -> None:
    tracker = OffsetTracker(mode="ranges")
    tracker.add_slice(TP, LOW, position=0)
    feed(tracker, dict.fromkeys(range(3), LOW_HASH))
    tracker.mark_processed(TP, 1, LOW_HASH)
    batch = tracker.prepare_commit()
    assert batch is not None
    reply = PartitionCommitReply(TP.topic, TP.partition, "MAX_INDIVIDUAL_COMMIT_REACHED", 0)
    assert tracker.commit_succeeded(batch, [reply]) == [reply]
    again = tracker.prepare_commit()
    assert again is not None
    assert list(again.partitions[0].ranges) == [(1, 1)]


def test_records_already_committed_or_outside_owned_slices_are_not_accepted() -> None:
    tracker = OffsetTracker()
    committed = CommittedOffsets(stable_offset=5, watermarks=(Watermark(LOW, 9),))
    tracker.add_slice(TP, LOW, position=5, committed=committed)
    assert not tracker.accept(TP, 4, LOW_HASH)
    assert not tracker.accept(TP, 6, LOW_HASH)
    assert not tracker.accept(TP, 7, HIGH_HASH)
    assert tracker.accept(TP, 9, LOW_HASH)
    assert not tracker.accept(TP, 9, LOW_HASH)


def test_deactivated_ranges_keep_their_progress_until_removed() -> None:
    tracker = OffsetTracker()
    tracker.add_slice(TP, KeyRange.full(), position=0)
    feed(tracker, {0: LOW_HASH, 1: HIGH_HASH, 2: HIGH_HASH})
    tracker.mark_processed(TP, 1, HIGH_HASH)
    tracker.deactivate(TP, [HIGH])
    assert tracker.owned() == {TP: [LOW]}
    assert not tracker.accept(TP, 3, HIGH_HASH)
    assert tracker.read_position(TP) == 3
    batch = tracker.prepare_commit()
    assert batch is not None
    assert list(batch.partitions[0].watermarks) == [Watermark(HIGH, 2)]
    tracker.commit_succeeded(batch, ok(batch))
    tracker.remove_inactive()
    assert [progress.keys for progress in tracker.slices_of(TP)] == [LOW]


def test_removing_inactive_slices_keeps_the_pieces_still_held_and_what_lies_elsewhere() -> None:
    tracker = OffsetTracker()
    tracker.add_slice(TP, KeyRange.full(), position=0)
    tracker.deactivate(TP, [HIGH])
    held = KeyRange(HIGH_HASH, HIGH_HASH)
    tracker.remove_inactive({TP: [HIGH]}, keep={TP: [held]})
    assert [(p.keys, p.active) for p in tracker.slices_of(TP)] == [(LOW, True), (held, False)]
    tracker.deactivate(TP, [LOW])
    # Removing the held piece's slice alone leaves the other revocation's slice alone.
    tracker.remove_inactive({TP: [held]})
    assert [(p.keys, p.active) for p in tracker.slices_of(TP)] == [(LOW, False)]


def test_a_slice_added_later_keeps_its_own_read_position() -> None:
    tracker = OffsetTracker()
    tracker.add_slice(TP, LOW, position=10)
    feed(tracker, {10: LOW_HASH, 11: LOW_HASH})
    tracker.add_slice(TP, HIGH, position=4)
    assert tracker.read_position(TP) == 4
    assert not tracker.accept(TP, 10, LOW_HASH)
    assert tracker.accept(TP, 5, HIGH_HASH)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[int], list[tuple[str, int]], CommitMode]:
    count = draw(st.integers(min_value=1, max_value=40))
    hashes = draw(st.lists(st.sampled_from([LOW_HASH, HIGH_HASH, 3]), min_size=count))
    steps = draw(
        st.lists(
            st.tuples(st.sampled_from(["mark", "commit", "fetch"]), st.integers(0, count - 1)),
            max_size=80,
        )
    )
    return hashes, steps, draw(st.sampled_from(["watermarks", "ranges", "offset"]))


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_a_commit_never_claims_an_unprocessed_offset(
    scenario: tuple[list[int], list[tuple[str, int]], CommitMode],
) -> None:
    hashes, steps, mode = scenario
    tracker = OffsetTracker(mode=mode)
    owned = KeyRange.full() if mode == "offset" else LOW
    tracker.add_slice(TP, owned, position=0)
    fetched = 0
    handed_out: list[int] = []
    processed: set[int] = set()
    known: set[int] = set()  # what the coordinator would know processed
    for action, index in steps:
        if action == "fetch" and fetched < len(hashes):
            end = min(len(hashes), fetched + 1 + index % 5)
            for offset in range(fetched, end):
                if tracker.accept(TP, offset, hashes[offset]):
                    handed_out.append(offset)
            tracker.advance(TP, end)
            fetched = end
        elif action == "mark" and handed_out:
            offset = handed_out.pop(index % len(handed_out))
            processed.add(offset)
            tracker.mark_processed(TP, offset, hashes[offset])
        elif action == "commit":
            batch = tracker.prepare_commit()
            if batch is None:
                continue
            [entry] = batch.partitions
            claimed = {o for start, end in entry.ranges for o in range(start, end + 1)}
            claimed |= set(range(min(entry.offset or 0, len(hashes))))
            for piece in entry.watermarks:
                claimed |= {
                    o
                    for o in range(min(piece.offset, len(hashes)))
                    if piece.keys.contains(hashes[o])
                }
            assert claimed <= processed
            known |= claimed
            others = {o for o, h in enumerate(hashes) if not owned.contains(h)}
            stable = 0
            while stable in known or stable in others:
                stable += 1
            tracker.commit_succeeded(batch, ok(batch, stable_offset=stable))
        total = sum(progress.runs for progress in tracker.slices_of(TP))
        assert tracker.uncommitted_ranges == total


def test_offset_mode_commits_the_lowest_unprocessed_offset_of_a_whole_partition() -> None:
    tracker = OffsetTracker(mode="offset")
    tracker.add_slice(TP, KeyRange.full(), position=0)
    feed(tracker, {0: LOW_HASH, 1: HIGH_HASH, 2: LOW_HASH, 3: HIGH_HASH})
    for offset, key_hash in ((0, LOW_HASH), (2, LOW_HASH), (3, HIGH_HASH)):
        tracker.mark_processed(TP, offset, key_hash)
    assert tracker.uncommitted_ranges == 0
    batch = tracker.prepare_commit()
    assert batch is not None
    [entry] = batch.partitions
    assert (entry.offset, list(entry.ranges), list(entry.watermarks)) == (1, [], [])
    tracker.commit_succeeded(batch, ok(batch, stable_offset=1))
    assert tracker.prepare_commit() is None
    tracker.mark_processed(TP, 1, HIGH_HASH)
    again = tracker.prepare_commit()
    assert again is not None
    assert again.partitions[0].offset == 4


@settings(max_examples=200, deadline=None)
@given(
    count=st.integers(min_value=1, max_value=40),
    head=st.integers(min_value=0, max_value=45),
    skip=st.sets(st.integers(min_value=0, max_value=39), max_size=5),
    mode=st.sampled_from(["watermarks", "offset"]),
)
def test_marking_the_pending_head_in_bulk_equals_marking_it_one_by_one(
    count: int, head: int, skip: set[int], mode: CommitMode
) -> None:
    """``mark_head`` either does exactly what per-record marks of the same offsets do, or
    (when they are not the oldest pending records, in order) nothing at all."""
    offsets = [o for o in range(count) if o not in skip]
    bulk, single = OffsetTracker(mode=mode), OffsetTracker(mode=mode)
    for tracker in (bulk, single):
        tracker.add_slice(TP, KeyRange.full(), position=0)
        feed(tracker, dict.fromkeys(range(count), LOW_HASH))
    marked = offsets[:head]
    is_head = marked == list(range(len(marked))) and bool(marked)
    assert bulk.mark_head(TP, marked) is is_head
    if is_head:
        for offset in marked:
            single.mark_processed(TP, offset, LOW_HASH)
    assert bulk.prepare_commit() == single.prepare_commit()


def test_bulk_marking_declines_partitions_with_several_slices_or_out_of_order_marks() -> None:
    split = OffsetTracker()
    split.add_slice(TP, LOW, position=0)
    split.add_slice(TP, HIGH, position=0)
    feed(split, dict.fromkeys(range(4), LOW_HASH))
    assert not split.mark_head(TP, [0, 1])
    whole = OffsetTracker()
    whole.add_slice(TP, KeyRange.full(), position=0)
    feed(whole, dict.fromkeys(range(4), LOW_HASH))
    whole.mark_processed(TP, 2, LOW_HASH)  # out of order: the head now waits on a settle
    assert not whole.mark_head(TP, [0, 1])
    assert not OffsetTracker(mode="ranges").mark_head(TP, [0])
