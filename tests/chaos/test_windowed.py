"""The page views' checker on hand-made inputs: it must catch each broken promise (a window
lost or below its reference, a surplus nothing explains, a final result emitted twice with
no crash between, a result for a window the reference lacks), and only those; a repeat
after its emitter crashed is the documented exception, counted apart."""

from __future__ import annotations

from tests.chaos.ledger import HandlerRun
from tests.chaos.windowed import Emission, FinalResult, check_windows, reference

WINDOW_MS = 60_000
# Two views of u1 in the first minute, one in the second; one of u2 in the first.
VIEWS = {
    (0, 0): ("u1", 1_000),
    (0, 1): ("u1", 59_999),
    (0, 2): ("u1", 60_000),
    (1, 0): ("u2", 30_000),
}
FINALS = [FinalResult("u1", 0, 2), FinalResult("u1", 60_000, 1), FinalResult("u2", 0, 1)]


def processed(partition: int, offset: int, *, process: str = "m0") -> HandlerRun:
    return HandlerRun(
        process=process,
        member="",
        epoch=0,
        generation=1,
        partition=partition,
        offset=offset,
        key=VIEWS[(partition, offset)][0],
        started=1.0 + offset,
        ended=1.1 + offset,
        outcome="done",
        wall_started=1.0,
        wall_ended=1.1,
    )


RUNS = [processed(*slot) for slot in VIEWS]


def emitted(user: str, start: int, views: int, at: float, process: str = "m0") -> Emission:
    return Emission(process, user, start, views, at)


def test_the_reference_counts_each_view_in_its_users_minute() -> None:
    assert reference(VIEWS, WINDOW_MS) == {("u1", 0): 2, ("u1", 60_000): 1, ("u2", 0): 1}


def test_final_results_equal_to_the_reference_pass() -> None:
    verdict = check_windows(VIEWS, WINDOW_MS, RUNS, FINALS)
    assert verdict.windows == 3
    assert verdict.undercounted == []
    assert verdict.unexplained_surplus == []
    assert verdict.final_repeats == []
    assert verdict.final_repeats_after_crash == []
    assert (verdict.counts_lost, verdict.surplus) == (0, 0)


def test_a_window_missing_or_below_its_reference_is_lost() -> None:
    missing = check_windows(VIEWS, WINDOW_MS, RUNS, FINALS[:2])
    assert missing.undercounted == ["u2@0: no final result, 1 views produced"]
    assert missing.counts_lost == 1
    below = check_windows(VIEWS, WINDOW_MS, RUNS, [FinalResult("u1", 0, 1), *FINALS[1:]])
    assert below.undercounted == ["u1@0: final 1, 2 views produced"]
    assert below.counts_lost == 1


def test_a_surplus_must_be_explained_by_views_processed_twice() -> None:
    finals = [FinalResult("u1", 0, 3), *FINALS[1:]]
    verdict = check_windows(VIEWS, WINDOW_MS, RUNS, finals)
    assert verdict.unexplained_surplus == [
        "u1@0: final 3, 2 views produced, views processed twice explain 0"
    ]
    assert verdict.surplus == 1
    # A view of the window processed again (a crash replayed it) explains one.
    replayed = check_windows(VIEWS, WINDOW_MS, [*RUNS, processed(0, 1, process="m1")], finals)
    assert replayed.unexplained_surplus == []
    assert replayed.surplus == 1
    # A view of another window does not.
    elsewhere = check_windows(VIEWS, WINDOW_MS, [*RUNS, processed(0, 2, process="m1")], finals)
    assert len(elsewhere.unexplained_surplus) == 1


def test_a_result_for_a_window_the_reference_lacks_is_a_surplus() -> None:
    # A closing view's window, still open at the end, or a window of no view at all.
    verdict = check_windows(VIEWS, WINDOW_MS, RUNS, [*FINALS, FinalResult("u2", 600_000, 1)])
    assert verdict.unexplained_surplus == [
        "u2@600000: final 1, 0 views produced, views processed twice explain 0"
    ]


def test_a_final_result_emitted_twice_without_a_crash_is_a_finding() -> None:
    finals = [*FINALS, FinalResult("u1", 0, 2)]
    emissions = [emitted("u1", 0, 2, 5.0), emitted("u1", 0, 2, 9.0, process="m1")]
    verdict = check_windows(VIEWS, WINDOW_MS, RUNS, finals, emissions)
    assert verdict.final_repeats == [
        "u1@0: emitted 2 times, 0 of them again after its emitter crashed"
    ]
    assert verdict.final_repeats_after_crash == []
    # The same value twice is still twice: not a surplus, and not a loss.
    assert verdict.unexplained_surplus == []
    assert verdict.undercounted == []
    # A crash of another process, or of the emitter before it emitted, excuses nothing.
    others = {"m1": [6.0], "m0": [4.0]}
    assert check_windows(VIEWS, WINDOW_MS, RUNS, finals, emissions, others).final_repeats


def test_a_repeat_after_its_emitter_crashed_is_the_exception_counted_apart() -> None:
    finals = [*FINALS, FinalResult("u1", 0, 2)]
    emissions = [emitted("u1", 0, 2, 5.0), emitted("u1", 0, 2, 9.0, process="m1")]
    verdict = check_windows(VIEWS, WINDOW_MS, RUNS, finals, emissions, {"m0": [5.2]})
    assert verdict.final_repeats == []
    assert verdict.final_repeats_after_crash == [
        "u1@0: emitted by m0 at 5.000, which crashed 0.200 s later; again by m1 at 9.000"
    ]
    # One crash excuses one repeat: a third emission with no crash before it is a finding.
    third = [*finals, FinalResult("u1", 0, 2)]
    more = [*emissions, emitted("u1", 0, 2, 12.0, process="m2")]
    verdict = check_windows(VIEWS, WINDOW_MS, RUNS, third, more, {"m0": [5.2]})
    assert len(verdict.final_repeats_after_crash) == 1
    assert verdict.final_repeats == [
        "u1@0: emitted 3 times, 1 of them again after its emitter crashed"
    ]
