"""The word count's checker on hand-made inputs: it must catch each broken promise (a count
lost, a surplus nothing explains, a changelog that restores other counts), and only those."""

from __future__ import annotations

from tests.chaos.counts import Write, check_counts
from tests.chaos.ledger import HandlerRun

LINES = {(0, 0): b"a b", (0, 1): b"a", (1, 0): b"b c"}
TRUE = {"a": 2, "b": 2, "c": 1}
SPLITS = [(0, 0), (0, 1), (1, 0)]


def counted(offset: int, word: str, *, process: str = "m0", partition: int = 0) -> HandlerRun:
    return HandlerRun(
        process=process,
        member="",
        epoch=0,
        generation=1,
        partition=partition,
        offset=offset,
        key=word,
        started=1.0 + offset,
        ended=1.1 + offset,
        outcome="done",
        wall_started=1.0,
        wall_ended=1.1,
    )


COUNTED = [counted(0, "a"), counted(1, "b"), counted(2, "a"), counted(3, "b"), counted(4, "c")]


def test_exact_counts_restored_from_the_changelog_pass() -> None:
    verdict = check_counts(LINES, SPLITS, COUNTED, TRUE, TRUE)
    assert verdict.undercounted == []
    assert verdict.unexplained_surplus == []
    assert verdict.restore_mismatches == []
    assert verdict.counts_lost == 0
    assert verdict.surplus == 0


def test_a_count_below_the_truth_is_lost() -> None:
    # The case: a stale write landing after the heir's, the sink and changelog alike.
    final = {**TRUE, "a": 1}
    verdict = check_counts(LINES, SPLITS, COUNTED, final, final)
    assert verdict.undercounted == ["a: counted 1, produced 2"]
    assert verdict.counts_lost == 1
    assert verdict.restore_mismatches == []
    # A word never counted at all is lost too.
    missing = {"a": 2, "b": 2}
    assert check_counts(LINES, SPLITS, COUNTED, missing, missing).counts_lost == 1


def test_a_surplus_must_be_explained_by_inputs_processed_twice() -> None:
    final = {**TRUE, "a": 3}
    verdict = check_counts(LINES, SPLITS, COUNTED, final, final)
    assert len(verdict.unexplained_surplus) == 1
    assert verdict.surplus == 1
    # A word record counted twice explains one more.
    recounted = check_counts(LINES, SPLITS, [*COUNTED, counted(0, "a", process="m1")], final, final)
    assert recounted.unexplained_surplus == []
    # So does a line split twice: its words went to the counters again.
    resplit = check_counts(LINES, [*SPLITS, (0, 1)], COUNTED, final, final)
    assert resplit.unexplained_surplus == []
    # But not for a word the line does not hold.
    other = {**TRUE, "c": 2}
    assert len(check_counts(LINES, [*SPLITS, (0, 1)], COUNTED, other, other).unexplained_surplus)


def test_a_changelog_restoring_other_counts_than_the_sink_breaks_the_restore() -> None:
    restored = {**TRUE, "b": 1}
    verdict = check_counts(LINES, SPLITS, COUNTED, TRUE, restored)
    assert verdict.restore_mismatches == ["b: the sink ends at 2, the changelog at 1"]
    missing = {"a": 2, "c": 1}
    assert len(check_counts(LINES, SPLITS, COUNTED, TRUE, missing).restore_mismatches) == 1


def test_a_count_going_down_in_the_changelog_is_a_write_after_a_newer_one() -> None:
    # The measurement: ...21, 22, 23, 7: the stale instance's write landed last.
    changelog = {"a": [1, 2], "b": [1, 2, 3, 1, 2]}
    writes = [Write("m1", "b", 3, 5.0), Write("m0", "b", 1, 6.0)]
    verdict = check_counts(LINES, SPLITS, COUNTED, TRUE, TRUE, changelog, writes)
    assert verdict.regressions == ["b: the changelog goes from 3 to 1, written by m0 at 6.000"]
    assert verdict.frozen_writes == []
    steady = check_counts(LINES, SPLITS, COUNTED, TRUE, TRUE, {"a": [1, 2, 2, 3]}, writes)
    assert steady.regressions == []


def test_a_write_a_stopped_process_had_handed_to_its_producer_is_the_exception() -> None:
    changelog = {"b": [1, 2, 3, 1]}
    writes = [Write("m0", "b", 1, 6.0)]
    frozen = {"m0": [(6.2, 10.0)]}
    verdict = check_counts(LINES, SPLITS, COUNTED, TRUE, TRUE, changelog, writes, frozen)
    assert verdict.regressions == []
    assert len(verdict.frozen_writes) == 1
    # A freeze long before the write excuses nothing.
    earlier = {"m0": [(1.0, 3.0)]}
    assert check_counts(LINES, SPLITS, COUNTED, TRUE, TRUE, changelog, writes, earlier).regressions


def test_a_write_handed_to_the_producer_while_its_broker_was_cut_off_is_the_exception() -> None:
    # Seed 67's shape: m1 handed 1 over during its cut; the heir wrote 2 and 3 before the
    # cut ended and m1's producer delivered.
    changelog = {"b": [1, 2, 3, 1]}
    writes = [Write("m1", "b", 1, 6.0)]
    cut = {"m1": [(5.5, 9.0)]}
    verdict = check_counts(LINES, SPLITS, COUNTED, TRUE, TRUE, changelog, writes, cut_off=cut)
    assert verdict.regressions == []
    assert verdict.frozen_writes == []
    assert verdict.delayed_writes == ["b: the changelog goes from 3 to 1, written by m1 at 6.000"]
    # A write after the link came back was delivered at once: nothing excuses it, nor
    # another process's cut.
    for elsewhere in ({"m1": [(2.0, 5.9)]}, {"m0": [(5.5, 9.0)]}):
        late = check_counts(
            LINES, SPLITS, COUNTED, TRUE, TRUE, changelog, writes, cut_off=elsewhere
        )
        assert len(late.regressions) == 1
