"""The chaos checker on hand-made ledgers: it must catch each broken promise, and only those."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from tests.chaos.checker import Verdict, check, figures, percentile, recovery_s, report
from tests.chaos.faults import (
    BROKER_LINK,
    COORDINATOR_KILL,
    EVERYONE,
    KINDS,
    LOOP_BLOCK,
    MEMBER_FREEZE,
    MEMBER_KILL,
    OF_A_MEMBER,
    RUNTIME_KINDS,
    STUCK_HANDLER,
    TWO_AT_ONCE,
    Fault,
    FaultRecord,
    plan,
)
from tests.chaos.ledger import HandlerRun, read_journal

SESSION_S = 2.0


def run(
    process: str,
    offset: int,
    key: str,
    started: float,
    ended: float | None,
    *,
    member: str = "",
    generation: int = 0,
    outcome: str = "done",
    partition: int = 0,
) -> HandlerRun:
    return HandlerRun(
        process=process,
        member=member or f"id-{process}",
        epoch=1,
        generation=generation,
        partition=partition,
        offset=offset,
        key=key,
        started=started,
        ended=ended,
        outcome=outcome,
        wall_started=started,
        wall_ended=ended,
    )


def verdict(runs: list[HandlerRun], faults: list[FaultRecord], end: int) -> Verdict:
    return check(runs, faults, {0: end}, session_s=SESSION_S, commit_interval_s=0.2, in_flight=1)


def test_a_clean_ledger_passes() -> None:
    runs = [
        run("m0", 0, "a", 1.0, 1.1),
        run("m1", 1, "b", 1.0, 1.2),
        run("m0", 2, "a", 1.2, 1.3),
    ]
    outcome = verdict(runs, [], 3)
    assert outcome.ok, outcome
    assert outcome.frozen_in_handler == []


def test_an_offset_never_finished_is_lost() -> None:
    runs = [run("m0", 0, "a", 1.0, 1.1), run("m0", 1, "b", 1.1, 1.2, outcome="cancelled")]
    assert verdict(runs, [], 3).lost == [(0, 1), (0, 2)]


def test_two_members_on_one_key_at_once_is_an_overlap() -> None:
    runs = [run("m0", 0, "a", 1.0, 2.0), run("m1", 1, "a", 1.5, 1.6)]
    outcome = verdict(runs, [], 2)
    assert len(outcome.overlaps) == 1
    assert not outcome.ok


def test_a_handler_frozen_mid_call_is_counted_apart_once() -> None:
    runs = [run("m0", 0, "a", 1.0, 8.0), run("m1", 1, "a", 4.0, 4.1), run("m1", 2, "a", 4.2, 4.3)]
    freeze = FaultRecord(MEMBER_FREEZE, "m0", 1.5, 7.5)
    outcome = verdict(runs, [freeze], 2)
    assert outcome.overlaps == []
    assert len(outcome.frozen_in_handler) == 1


def test_a_handler_started_after_the_freeze_is_not_excused() -> None:
    runs = [run("m0", 0, "a", 7.6, 9.0), run("m1", 1, "a", 8.0, 8.1)]
    freeze = FaultRecord(MEMBER_FREEZE, "m0", 1.5, 7.5)
    assert len(verdict(runs, [freeze], 2).overlaps) == 1


def test_a_killed_handler_runs_until_the_kill() -> None:
    killed = run("m0", 0, "a", 1.0, None)
    kill = FaultRecord(MEMBER_KILL, "m0", 1.2, 3.0)
    after_kill = [killed, run("m1", 0, "a", 4.0, 4.1)]
    assert verdict(after_kill, [kill], 1).ok
    before_kill = [killed, run("m1", 0, "a", 1.1, 1.15)]
    assert len(verdict(before_kill, [kill], 1).overlaps) == 1


def test_a_hand_out_past_the_session_without_losing_the_slices_is_a_zombie() -> None:
    block = FaultRecord(LOOP_BLOCK, "m0", 2.0, 8.0)
    zombie = [run("m0", 0, "a", 1.0, 1.1), run("m0", 1, "b", 8.1, 8.2)]
    assert len(verdict(zombie, [block], 2).zombie_handouts) == 1
    rejoined = [run("m0", 0, "a", 1.0, 1.1), run("m0", 1, "b", 9.0, 9.1, generation=1)]
    assert verdict(rejoined, [block], 2).zombie_handouts == []


def test_a_fault_shorter_than_the_session_leaves_the_member_its_slices() -> None:
    outage = FaultRecord(COORDINATOR_KILL, "0", 2.0, 3.0)
    runs = [run("m0", 0, "a", 1.0, 1.1), run("m0", 1, "b", 5.0, 5.1)]
    assert verdict(runs, [outage], 2).zombie_handouts == []
    long_outage = FaultRecord(COORDINATOR_KILL, EVERYONE, 2.0, 6.0)
    assert len(verdict(runs, [long_outage], 2).zombie_handouts) == 1


def test_a_key_going_backwards_within_a_members_run_is_an_order_violation() -> None:
    runs = [run("m0", 1, "a", 1.0, 1.1), run("m0", 0, "a", 1.2, 1.3)]
    assert len(verdict(runs, [], 2).order_violations) == 1
    # A redelivery to the key's next owner starts a new run of the key.
    moved = [run("m0", 1, "a", 1.0, 1.1), run("m1", 0, "a", 4.0, 4.1), run("m1", 1, "a", 4.2, 4.3)]
    assert verdict(moved, [], 2).order_violations == []


def test_redeliveries_are_charged_to_the_fault_before_them() -> None:
    kill = FaultRecord(MEMBER_KILL, "m0", 2.0, 3.0)
    runs = [
        run("m0", 0, "a", 1.0, 1.1),
        run("m0", 1, "b", 1.1, 1.2),
        run("m1", 0, "a", 4.0, 4.1),
        run("m1", 1, "b", 4.1, 4.2),
    ]
    outcome = verdict(runs, [kill], 2)
    assert outcome.duplicates_per_fault == [2]
    assert outcome.duplicates_unexplained == 0


def test_a_redelivery_after_the_next_fault_began_is_charged_to_the_one_that_caused_it() -> None:
    outage = FaultRecord(COORDINATOR_KILL, EVERYONE, 2.0, 7.0)
    cut = FaultRecord(BROKER_LINK, "m1", 7.5, 8.0)
    runs = [run("m0", 0, "a", 3.0, 3.1), run("m1", 0, "a", 9.0, 9.1)]
    assert verdict(runs, [outage, cut], 1).duplicates_per_fault == [1, 0]
    unexplained = [run("m0", 0, "a", 1.0, 1.1), run("m1", 0, "a", 1.5, 1.6)]
    assert verdict(unexplained, [outage], 1).duplicates_unexplained == 1


def test_recovery_is_the_end_of_the_pause_the_fault_caused() -> None:
    kill = FaultRecord(MEMBER_KILL, "m0", 10.0, 11.0)
    steady = [run("m0", index, "a", 7.0 + index * 0.1, 7.05 + index * 0.1) for index in range(30)]
    resumed = [run("m1", 100 + index, "a", 12.5 + index * 0.1, 12.55) for index in range(5)]
    other_keys = [run("m1", 200 + index, "z", 10.0 + index * 0.1, 10.05) for index in range(20)]
    assert recovery_s(steady + resumed + other_keys, kill) == 2.5
    unbroken = [run("m0", index, "a", 9.0 + index * 0.1, 9.05) for index in range(40)]
    assert recovery_s(unbroken, kill) == 0.0
    # Keys the member no longer had when the fault struck are not its keys.
    moved_away = [*steady, run("m1", 99, "a", 9.95, 9.97), *resumed]
    assert recovery_s(moved_away, kill) == 0.0
    # A pause after the next fault began is that fault's.
    later_pause = [*steady, *unbroken, run("m1", 300, "a", 20.0, 20.1)]
    assert recovery_s(later_pause, kill, until=13.0) == 0.0
    assert recovery_s(later_pause, kill) == 20.0 - 10.0
    # A pause under way when the next fault struck is this one's, however long it lasts.
    stalled_through = [*steady, run("m1", 300, "a", 15.0, 15.1)]
    assert recovery_s(stalled_through, kill, until=13.5) == 15.0 - 10.0


def test_figures_carry_exactly_the_issues_keys() -> None:
    outcome = verdict([run("m0", 0, "a", 1.0, 1.1)], [FaultRecord(MEMBER_KILL, "m0", 2, 3)], 1)
    shown = figures([outcome], [[MEMBER_KILL]])
    assert set(shown) == {
        "runs",
        "faults",
        "records",
        "lost",
        "overlaps",
        "frozen_in_handler",
        "duplicates_p50",
        "duplicates_max",
        "recovery_s",
    }
    assert shown["faults"] == {MEMBER_KILL: 1}
    # Its key never moved again after the kill: recovery counts as the whole horizon.
    assert shown["recovery_s"] == {MEMBER_KILL: {"p50": 60.0, "p99": 60.0}}
    json.dumps(shown)


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 0.5) == 0.0
    assert percentile([3, 1, 2], 0.5) == 2
    assert percentile(list(range(1, 101)), 0.99) == 99


def test_the_plan_is_a_function_of_the_seed() -> None:
    shape = {"duration_s": 120.0, "members": 5, "replicas": 2, "session_s": SESSION_S}
    assert plan(7, **shape) == plan(7, **shape)
    assert plan(7, **shape) != plan(8, **shape)
    kinds = [fault.kind for fault in plan(7, **shape)]
    assert len(set(kinds[: len(KINDS)])) == len(KINDS), "each kind once before any repeats"


def test_the_journal_pairs_starts_with_ends_and_keeps_a_killed_start(tmp_path: Path) -> None:
    journal = tmp_path / "m0.jsonl"
    common = {"p": "m0", "m": "id", "ep": 1, "g": 0, "pt": 0, "k": "61", "w": 0.0}
    lines = [
        {"e": "start", "o": 0, "t": 1.0, **common},
        {"e": "start", "o": 1, "t": 1.1, **common},
        {"e": "end", "o": 0, "t": 1.2, "ok": "done", **common},
        {"e": "blocked", "p": "m0", "s": 1.3, "t": 5.0},
    ]
    journal.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"e": "sta')
    runs, blocks = read_journal(journal)
    assert sorted((entry.offset, entry.ended, entry.outcome) for entry in runs) == [
        (0, 1.2, "done"),
        (1, None, "killed"),
    ]
    assert [(block.started, block.ended) for block in blocks] == [(1.3, 5.0)]


def test_a_stable_offset_short_of_the_end_counts_as_lost() -> None:
    runs = [run("m0", 0, "a", 1.0, 1.1), run("m0", 1, "b", 1.1, 1.2)]
    outcome = check(
        runs, [], {0: 2}, session_s=SESSION_S, commit_interval_s=0.2, in_flight=1, stable={0: 1}
    )
    assert outcome.unfinished == {0: 1}
    assert not outcome.ok
    assert figures([outcome], [[]])["lost"] == 1


def test_redelivering_more_than_was_uncommitted_breaks_the_bound() -> None:
    kill = FaultRecord(MEMBER_KILL, "m0", 2.0, 2.5)
    first = [
        run("m0", offset, "a", 1.0 + offset * 0.01, 1.0 + offset * 0.01) for offset in range(10)
    ]
    again = [
        run("m1", offset, "a", 5.0 + offset * 0.01, 5.0 + offset * 0.01) for offset in range(10)
    ]
    # Ten a second at peak: a kill of 0.5 s leaves at most 10 * (0.2 + 0.5) + 1 = 8 uncommitted.
    outcome = verdict(first + again, [kill], 10)
    assert outcome.duplicates_per_fault == [10]
    assert len(outcome.excess_duplicates) == 1
    assert verdict(first + again[:7], [kill], 10).excess_duplicates == []


def test_a_retry_after_a_failed_call_is_no_order_violation() -> None:
    failed_then_retried = [
        run("m0", 0, "a", 1.0, 1.1, outcome="error"),
        run("m0", 0, "a", 1.3, 1.4),
    ]
    assert verdict(failed_then_retried, [], 1).order_violations == []
    # The same record again after it succeeded, within one membership, is not a retry.
    done_then_again = [run("m0", 0, "a", 1.0, 1.1), run("m0", 0, "a", 1.3, 1.4)]
    assert len(verdict(done_then_again, [], 1).order_violations) == 1


def test_a_call_past_the_processing_timeout_failed_even_if_it_returned() -> None:
    timed_out = [run("m0", 0, "a", 1.0, 7.0), run("m0", 0, "a", 7.1, 7.2)]
    judged = check(
        timed_out,
        [],
        {0: 1},
        session_s=SESSION_S,
        commit_interval_s=0.2,
        in_flight=1,
        processing_timeout_s=5.0,
    )
    assert judged.order_violations == []
    assert len(verdict(timed_out, [], 1).order_violations) == 1


def test_a_retry_started_while_the_timed_out_call_still_runs_is_an_overlap() -> None:
    retried_early = [run("m0", 0, "a", 1.0, 7.0), run("m0", 0, "a", 6.1, 6.2)]
    judged = check(
        retried_early,
        [],
        {0: 1},
        session_s=SESSION_S,
        commit_interval_s=0.2,
        in_flight=1,
        processing_timeout_s=5.0,
    )
    assert len(judged.overlaps) == 1


def test_a_call_with_no_end_ran_until_its_process_exited() -> None:
    # A pool child stopped with its member on a graceful exit writes no end.
    unended = run("m0", 0, "a", 1.0, None)
    exits = {"m0": [3.0]}
    after_exit = [unended, run("m1", 1, "a", 3.5, 3.6)]
    judged = check(
        after_exit, [], {0: 2}, session_s=SESSION_S, commit_interval_s=0.2, in_flight=1, exits=exits
    )
    assert judged.overlaps == []
    before_exit = [unended, run("m1", 1, "a", 2.5, 2.6)]
    judged = check(
        before_exit,
        [],
        {0: 2},
        session_s=SESSION_S,
        commit_interval_s=0.2,
        in_flight=1,
        exits=exits,
    )
    assert len(judged.overlaps) == 1
    assert "m0" in judged.overlaps[0] and "m1" in judged.overlaps[0]


def test_a_dead_lettered_record_counts_as_handled() -> None:
    runs = [run("m0", 0, "a", 1.0, 1.1, outcome="error"), run("m0", 1, "b", 1.1, 1.2)]
    assert verdict(runs, [], 2).lost == [(0, 0)]
    judged = check(
        runs,
        [],
        {0: 2},
        session_s=SESSION_S,
        commit_interval_s=0.2,
        in_flight=1,
        dead_lettered=frozenset({(0, 0)}),
    )
    assert judged.lost == []


def test_a_stuck_call_is_frozen_only_where_it_blocks_the_event_loop() -> None:
    runs = [run("m0", 0, "a", 1.0, 5.0), run("m1", 1, "a", 3.0, 3.1)]
    # The runner dates a stuck call's fault from the call's start.
    stuck = FaultRecord(STUCK_HANDLER, "m0", 1.0, 8.0)
    # A stuck call in a thread or a process outlives the revoke timeout: a violation.
    assert len(verdict(runs, [stuck], 2).overlaps) == 1
    judged = check(
        runs,
        [stuck],
        {0: 2},
        session_s=SESSION_S,
        commit_interval_s=0.2,
        in_flight=1,
        frozen_kinds=frozenset({STUCK_HANDLER}),
    )
    assert judged.overlaps == []
    assert len(judged.frozen_in_handler) == 1


def test_a_handlers_membership_is_counted_from_boot_and_loss_events(tmp_path: Path) -> None:
    journal = tmp_path / "m0.jsonl"
    slot = {"p": "m0", "pt": 0, "k": "61", "w": 0.0}
    lines = [
        {"e": "boot", "p": "m0", "t": 0.5},
        {"e": "start", "o": 0, "t": 1.0, **slot},
        {"e": "end", "o": 0, "t": 1.1, "ok": "done", **slot},
        {"e": "lost", "p": "m0", "t": 2.0},
        {"e": "start", "o": 0, "t": 3.0, **slot},
        {"e": "end", "o": 0, "t": 3.1, "ok": "done", **slot},
        {"e": "boot", "p": "m0", "t": 4.0},
        {"e": "start", "o": 1, "t": 5.0, **slot},
    ]
    journal.write_text("".join(json.dumps(line) + "\n" for line in lines))
    runs, _ = read_journal(journal)
    assert sorted((entry.started, entry.generation) for entry in runs) == [
        (1.0, 1),
        (3.0, 2),
        (5.0, 3),
    ]
    # The record handed out again after the loss starts a new run of its key.
    assert verdict(runs, [], 2).order_violations == []


def test_a_call_in_a_pool_child_that_was_killed_ran_until_the_parent_saw_the_child_gone(
    tmp_path: Path,
) -> None:
    """Not until the member process itself exited (it commits and leaves after the kill):
    the heir may start the key between the two, which is no overlap."""
    journal = tmp_path / "m0.jsonl"
    slot = {"p": "m0", "pt": 0, "k": "61", "w": 0.0}
    lines = [
        {"e": "boot", "p": "m0", "t": 0.5},
        {"e": "start", "o": 0, "t": 1.0, "pid": 7, **slot},
        {"e": "start", "o": 1, "t": 1.5, "pid": 8, **slot},
        {"e": "child_gone", "p": "m0", "t": 2.0, "w": 2.0, "pid": 7},
    ]
    journal.write_text("".join(json.dumps(line) + "\n" for line in lines))
    runs, _ = read_journal(journal)
    by_offset = {entry.offset: entry for entry in runs}
    assert (by_offset[0].ended, by_offset[0].outcome) == (2.0, "killed")
    # Another child, still running when the journal ends: no end known.
    assert by_offset[1].ended is None
    heir = run("m1", 0, "a", 2.5, 2.6)
    killed = replace(by_offset[0], key="a")
    assert verdict([killed, heir], [], 2).overlaps == []


def test_a_key_granted_back_after_its_process_gave_slices_up_starts_a_new_run(
    tmp_path: Path,
) -> None:
    """A call that ended after its slice was revoked is not committed; when the key comes
    back to the same member, it is handed out again from the committed point: no order
    violation. Without a release in between, the repeat still is one."""
    journal = tmp_path / "m0.jsonl"
    slot = {"p": "m0", "pt": 0, "k": "61", "w": 0.0}
    lines = [
        {"e": "boot", "p": "m0", "t": 0.5},
        {"e": "start", "o": 4, "t": 1.0, **slot},
        {"e": "end", "o": 4, "t": 1.1, "ok": "done", **slot},
        {"e": "released", "p": "m0", "t": 2.0},
        {"e": "start", "o": 4, "t": 3.0, **slot},
        {"e": "end", "o": 4, "t": 3.1, "ok": "done", **slot},
        {"e": "start", "o": 4, "t": 4.0, **slot},
        {"e": "end", "o": 4, "t": 4.1, "ok": "done", **slot},
    ]
    journal.write_text("".join(json.dumps(line) + "\n" for line in lines))
    runs, _ = read_journal(journal)
    assert sorted(entry.releases for entry in runs) == [0, 1, 1]
    assert len(verdict(runs, [], 2).order_violations) == 1


def test_the_report_has_an_entry_per_runtime_and_sums_them_at_the_top() -> None:
    clean = verdict([run("m0", 0, "a", 1.0, 1.1)], [], 1)
    overlapping = verdict([run("m0", 0, "a", 1.0, 2.0), run("m1", 1, "a", 1.5, 1.6)], [], 3)
    counting = replace(clean, undercounted=["w1: counted 1, produced 3"], counts_lost=2)
    shown = report(
        {"run": [clean], "worker-threads": [overlapping], "streams": [counting]},
        [[], [], []],
        counting=frozenset({"streams"}),
    )
    runtimes = shown["runtimes"]
    assert isinstance(runtimes, dict)
    assert set(runtimes) == {"run", "worker-threads", "streams"}
    assert runtimes["worker-threads"]["overlaps"] == 1
    assert runtimes["worker-threads"]["lost"] == 1
    assert runtimes["streams"]["counts_lost"] == 2
    assert runtimes["streams"]["lost"] == 2
    assert not runtimes["streams"]["ok"]
    assert runtimes["run"]["ok"]
    assert "counts_lost" not in runtimes["run"]
    for key in ("lost", "overlaps", "duplicates_p50", "duplicates_max"):
        assert key in runtimes["run"]
    assert shown["lost"] == 3
    assert shown["overlaps"] == 1
    json.dumps(shown)


def test_two_faults_at_once_overlap_in_time_on_different_members() -> None:
    shape = {"members": 4, "replicas": 2, "session_s": SESSION_S}
    faults = plan(11, duration_s=400.0, kinds=(*KINDS, *RUNTIME_KINDS, TWO_AT_ONCE), **shape)
    pairs: dict[int, list[Fault]] = {}
    for fault in faults:
        if fault.pair:
            pairs.setdefault(fault.pair, []).append(fault)
    assert pairs
    for first, second in pairs.values():
        assert first.kind != second.kind
        assert first.at_s < second.at_s < first.at_s + first.duration_s
        if first.kind in OF_A_MEMBER and second.kind in OF_A_MEMBER:
            assert first.target != second.target
    # The plan of the original kinds is as before: the seeds of earlier runs replay.
    assert all(fault.pair == 0 for fault in plan(11, duration_s=400.0, **shape))
