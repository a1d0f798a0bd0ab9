"""The invariants, judged from the ledger and the faults as they happened (no I/O here, so the
checker itself is tested on hand-made ledgers).

- nothing lost: every produced offset was processed (a handler returned) at least once;
- no key in two places at once: no two handler runs of one key overlap in time unless the
  earlier one was already in its handler when its process froze (``frozen_in_handler``);
- no zombie hand-out: after a fault outlasting the session, the member hands out nothing
  until it lost its slices and rejoined (its loss count moved on);
- per-key order within each member's run of a key;
- duplicates (records handed out again) per fault, and recovery time per fault.

The word count's own invariants (counts, surpluses, the changelog) are in
``tests/chaos/counts.py``, the page views' (windows against a plain-Python reference, final
results emitted twice) in ``tests/chaos/windowed.py``; ``report`` gathers the figures of
every runtime a run drove.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from tests.chaos.faults import (
    COORDINATOR_LINK,
    EVERYONE,
    FREEZING,
    MEMBER_KILL,
    OF_A_MEMBER,
    FaultRecord,
)
from tests.chaos.ledger import KILLED, HandlerRun

DONE = "done"
# The keys a fault touches: those its member (or, for a cluster-wide fault, anyone) was the
# last to handle in this long before it.
AFFECTED_LOOKBACK_S = 3.0
# A pause in the affected keys' hand-outs shorter than this is the stream's own rhythm.
STALL_S = 0.5
RECOVERY_HORIZON_S = 60.0
# A violation this soon after a fault ended is named with it (its effects outlast it).
AFTER_FAULT_S = 2.0


@dataclass
class Verdict:
    records: int
    lost: list[tuple[int, int]] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    frozen_in_handler: list[str] = field(default_factory=list)
    zombie_handouts: list[str] = field(default_factory=list)
    order_violations: list[str] = field(default_factory=list)
    duplicates_per_fault: list[int] = field(default_factory=list)
    duplicates_unexplained: int = 0
    # Faults that redelivered more than could have been uncommitted when they struck.
    excess_duplicates: list[str] = field(default_factory=list)
    recovery_s: list[tuple[str, float]] = field(default_factory=list)
    # Per partition, how far the group's stable offset stayed short of the end once faults
    # stopped (records processed but never committed, or never processed).
    unfinished: dict[int, int] = field(default_factory=dict)
    # The word count's (``tests/chaos/counts.py``): words counted below their truth, surpluses
    # no input processed twice explains, words whose changelog and sink end differently, and
    # the counts lost over all words.
    undercounted: list[str] = field(default_factory=list)
    unexplained_surplus: list[str] = field(default_factory=list)
    restore_mismatches: list[str] = field(default_factory=list)
    # Changelog values going down: writes landing after newer ones, and, counted apart as
    # the documented exception, those a process had already handed to its producer when it
    # was frozen or when its link to the broker was cut.
    regressions: list[str] = field(default_factory=list)
    frozen_writes: list[str] = field(default_factory=list)
    delayed_writes: list[str] = field(default_factory=list)
    counts_lost: int = 0
    surplus: int = 0
    # The page views' (``tests/chaos/windowed.py``; ``undercounted``, ``unexplained_surplus``,
    # ``counts_lost`` and ``surplus`` are then per window): the reference's windows, final
    # results emitted again with no crash to explain it, and those after a crash (the
    # documented exception, counted apart).
    windows: int = 0
    final_repeats: list[str] = field(default_factory=list)
    final_repeats_after_crash: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.unfinished
            or self.overlaps
            or self.zombie_handouts
            or self.order_violations
            or self.excess_duplicates
            or self.undercounted
            or self.unexplained_surplus
            or self.restore_mismatches
            or self.regressions
            or self.final_repeats
        )

    @property
    def lost_total(self) -> int:
        """Records never processed or never committed, plus the word count's lost counts."""
        return len(self.lost) + sum(self.unfinished.values()) + self.counts_lost


def check(
    runs: Sequence[HandlerRun],
    faults: Sequence[FaultRecord],
    produced: dict[int, int],
    *,
    session_s: float,
    commit_interval_s: float,
    in_flight: int,
    stable: dict[int, int] | None = None,
    exits: dict[str, list[float]] | None = None,
    dead_lettered: frozenset[tuple[int, int]] = frozenset(),
    processing_timeout_s: float | None = None,
    frozen_kinds: frozenset[str] = FREEZING,
) -> Verdict:
    """``produced`` maps each partition to its end offset (one past the last record),
    ``stable`` to the group's stable offset once faults stopped (None: not checked);
    ``in_flight`` is how many handlers may run at once over all members; ``exits`` when
    each member process was seen to end; ``dead_lettered`` the records (partition, offset)
    on the dead-letter topic, which count as handled; ``processing_timeout_s`` the
    runtime's, past which a call that returned has failed all the same; ``frozen_kinds``
    the faults that freeze a member mid-call (in the word count, a processor blocking the
    event loop is one)."""
    runs = close_killed(runs, faults, exits)
    overlapping, frozen = overlaps(runs, faults, frozen_kinds)
    redelivered, unexplained = duplicates_per_fault(runs, faults)
    bounds = duplicate_bounds(
        runs, faults, session_s=session_s, commit_interval_s=commit_interval_s, in_flight=in_flight
    )
    return Verdict(
        records=sum(produced.values()),
        lost=lost(runs, produced, dead_lettered),
        overlaps=overlapping,
        frozen_in_handler=frozen,
        zombie_handouts=zombie_handouts(runs, faults, session_s=session_s),
        order_violations=order_violations(runs, processing_timeout_s),
        duplicates_per_fault=redelivered,
        duplicates_unexplained=unexplained,
        excess_duplicates=[
            f"{fault.kind} {fault.target} at {fault.started:.3f}: {count} redelivered, "
            f"bound {bound:.0f}"
            for fault, count, bound in zip(faults, redelivered, bounds, strict=True)
            if count > bound
        ],
        recovery_s=[
            (fault.kind, recovery_s(runs, fault, until=following))
            for fault, following in zip(
                faults, [*(later.started for later in faults[1:]), math.inf], strict=False
            )
        ],
        unfinished={}
        if stable is None
        else {
            partition: end - stable.get(partition, 0)
            for partition, end in produced.items()
            if stable.get(partition, 0) < end
        },
    )


def close_killed(
    runs: Sequence[HandlerRun],
    faults: Sequence[FaultRecord],
    exits: dict[str, list[float]] | None = None,
) -> list[HandlerRun]:
    """A handler its process died in (or whose pool child was stopped with it) ran until
    the process ended: its first exit after the start, else the first kill after it."""
    ends = sorted(
        [(fault.started, fault.target) for fault in faults if fault.kind == MEMBER_KILL]
        + [(at, process) for process, times in (exits or {}).items() for at in times]
    )
    closed = []
    for run in runs:
        if run.ended is None:
            at = next((t for t, target in ends if target == run.process and t >= run.started), None)
            run = replace(run, ended=math.inf if at is None else at, outcome=KILLED)
        closed.append(run)
    return closed


def lost(
    runs: Iterable[HandlerRun],
    produced: dict[int, int],
    dead_lettered: frozenset[tuple[int, int]] = frozenset(),
) -> list[tuple[int, int]]:
    done = {(run.partition, run.offset) for run in runs if run.outcome == DONE} | dead_lettered
    return [
        (partition, offset)
        for partition, end in sorted(produced.items())
        for offset in range(end)
        if (partition, offset) not in done
    ]


def _ended(run: HandlerRun) -> float:
    return math.inf if run.ended is None else run.ended


def overlaps(
    runs: Sequence[HandlerRun],
    faults: Sequence[FaultRecord],
    frozen_kinds: frozenset[str] = FREEZING,
) -> tuple[list[str], list[str]]:
    """Runs of one key at once: (the violating pairs, the excepted handler runs that were
    frozen mid-call while later runs of their key went on elsewhere, each counted once)."""
    freezes: dict[str, list[FaultRecord]] = defaultdict(list)
    for fault in faults:
        if fault.kind in frozen_kinds:
            freezes[fault.target].append(fault)
    per_key: dict[str, list[HandlerRun]] = defaultdict(list)
    for run in runs:
        per_key[run.key].append(run)
    violations: list[str] = []
    excepted: dict[tuple[str, int, int, float], str] = {}
    for key, key_runs in per_key.items():
        key_runs.sort(key=lambda run: run.started)
        active: list[HandlerRun] = []
        for run in key_runs:
            active = [earlier for earlier in active if _ended(earlier) > run.started]
            for earlier in active:
                frozen_mid_call = earlier.incarnation != run.incarnation and any(
                    earlier.started <= fault.started < _ended(earlier)
                    for fault in freezes[earlier.process]
                )
                if frozen_mid_call:
                    slot = (earlier.process, earlier.partition, earlier.offset, earlier.started)
                    excepted[slot] = (
                        f"key {key}: p{earlier.partition}@{earlier.offset} on {earlier.process} "
                        f"frozen mid-call while its key went on at {run.process}"
                    )
                else:
                    violations.append(
                        f"key {key}: p{run.partition}@{run.offset} on {_who(run)} started at "
                        f"{run.started:.3f} while p{earlier.partition}@{earlier.offset} ran on "
                        f"{_who(earlier)} ({earlier.started:.3f} to {_ended(earlier):.3f}, "
                        f"{earlier.outcome}){_during(faults, run.started)}"
                    )
            active.append(run)
    return violations, list(excepted.values())


def _during(faults: Sequence[FaultRecord], moment: float) -> str:
    """The faults under way at ``moment``, to name in a violation."""
    names = [
        f"{fault.kind} {fault.target}"
        for fault in faults
        if fault.started <= moment <= fault.ended + AFTER_FAULT_S
    ]
    return f" during {', '.join(names)}" if names else ""


def _who(run: HandlerRun) -> str:
    return f"{run.process}/{run.member or '-'}/g{run.generation}"


def zombie_handouts(
    runs: Sequence[HandlerRun], faults: Sequence[FaultRecord], *, session_s: float
) -> list[str]:
    """Records a member handed out more than a session after a fault cut it off (frozen,
    blocked, link cut, every coordinator replica or the database down: target ``*``)
    without having lost its slices first."""
    per_process: dict[str, list[HandlerRun]] = defaultdict(list)
    for run in runs:
        per_process[run.process].append(run)
    for process_runs in per_process.values():
        process_runs.sort(key=lambda run: run.started)
    found: list[str] = []
    for fault in faults:
        if fault.kind == MEMBER_KILL or fault.ended - fault.started <= session_s:
            continue
        if fault.kind in FREEZING or fault.kind == COORDINATOR_LINK:
            targets = [fault.target]
        elif fault.target == EVERYONE:
            targets = list(per_process)
        else:
            continue
        for process in targets:
            before = [run for run in per_process[process] if run.started <= fault.started]
            if not before:
                continue
            identity = before[-1].incarnation
            found.extend(
                f"{fault.kind} at {fault.started:.3f}: {process} handed out "
                f"p{run.partition}@{run.offset} at {run.started:.3f} as {run.member}"
                for run in per_process[process]
                if run.started > fault.started + session_s and run.incarnation == identity
            )
    return found


def order_violations(
    runs: Sequence[HandlerRun], processing_timeout_s: float | None = None
) -> list[str]:
    """Within one member's run of a key (one incarnation, between two times it gave slices
    up: a key revoked and granted back starts again from the group's committed point),
    offsets only go up; a record may come again in the same run only as a retry, after a
    call of it did not succeed (a retry started while the call still ran is an overlap)."""
    per_run_of_key: dict[tuple[object, ...], list[HandlerRun]] = defaultdict(list)
    for run in runs:
        per_run_of_key[(*run.incarnation, run.releases, run.partition, run.key)].append(run)
    problems = []
    for (process, member, _, _, partition, key), key_runs in per_run_of_key.items():
        key_runs.sort(key=lambda run: run.started)
        for before, after in itertools.pairwise(key_runs):
            failed = before.outcome != DONE or (
                processing_timeout_s is not None
                and _ended(before) - before.started > processing_timeout_s
            )
            retried = after.offset == before.offset and failed
            if after.offset < before.offset or (after.offset == before.offset and not retried):
                problems.append(
                    f"key {key} on {process}/{member}: p{partition}@{after.offset} handed out "
                    f"after p{partition}@{before.offset}"
                )
    return problems


def duplicates_per_fault(
    runs: Sequence[HandlerRun], faults: Sequence[FaultRecord]
) -> tuple[list[int], int]:
    """Each hand-out of a record after its first is charged to the fault that left the first
    uncommitted: the earliest one not over when the record was first handed out, and begun
    before the record was handed out again. Those no fault explains are returned apart (a
    clean rebalance redelivers nothing)."""
    first: dict[tuple[int, int], float] = {}
    again: list[tuple[float, float]] = []
    for run in sorted(runs, key=lambda run: run.started):
        slot = (run.partition, run.offset)
        if slot in first:
            again.append((first[slot], run.started))
        else:
            first[slot] = run.started
    counts = [0] * len(faults)
    unexplained = 0
    for handed_out, handed_again in again:
        cause = next(
            (
                index
                for index, fault in enumerate(faults)
                if fault.ended >= handed_out and fault.started <= handed_again
            ),
            None,
        )
        if cause is None:
            unexplained += 1
        else:
            counts[cause] += 1
    return counts, unexplained


def duplicate_bounds(
    runs: Sequence[HandlerRun],
    faults: Sequence[FaultRecord],
    *,
    session_s: float,
    commit_interval_s: float,
    in_flight: int,
) -> list[float]:
    """Per fault, the most it may redeliver: what was processed and not yet committed when
    it struck. Commits stop for a commit interval, plus for as long as the fault kept its
    members from committing while they still processed (at most a session: then they stop
    handing out), at the run's peak processing rate; plus every handler in flight."""
    per_second: dict[int, int] = defaultdict(int)
    for run in runs:
        per_second[math.floor(run.started)] += 1
    peak = max(per_second.values(), default=0)
    return [
        peak * (commit_interval_s + min(fault.ended - fault.started, session_s)) + in_flight
        for fault in faults
    ]


def recovery_s(runs: Sequence[HandlerRun], fault: FaultRecord, *, until: float = math.inf) -> float:
    """From the fault until the keys it touched are handed out again after the longest pause
    it caused (0 when they never paused longer than the stream's own rhythm), looking no
    further than the next fault (``until``) or the horizon."""
    horizon = min(until, fault.started + RECOVERY_HORIZON_S)
    last_before: dict[str, HandlerRun] = {}
    for run in runs:
        if fault.started - AFFECTED_LOOKBACK_S <= run.started <= fault.started:
            latest = last_before.get(run.key)
            if latest is None or run.started > latest.started:
                last_before[run.key] = run
    # A member's keys are those it was the last to be handed before the fault (an earlier
    # rebalance may have moved some of what it handled a moment before).
    affected = {
        key
        for key, run in last_before.items()
        if fault.kind not in OF_A_MEMBER or run.process == fault.target
    }
    later = sorted(
        run.started for run in runs if run.key in affected and run.started > fault.started
    )
    moments = [moment for moment in later if moment <= horizon]
    # A pause already under way when the next fault struck is this fault's, wherever it ends.
    resumed = next((moment for moment in later if moment > horizon), None)
    if resumed is not None and horizon - (moments[-1] if moments else fault.started) >= STALL_S:
        moments.append(resumed)
    if not moments:
        return horizon - fault.started if affected else 0.0
    longest_end = 0.0
    longest = 0.0
    previous = fault.started
    for moment in moments:
        if moment - previous > longest:
            longest, longest_end = moment - previous, moment
        previous = moment
    if longest < STALL_S:
        return 0.0
    return longest_end - fault.started


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def figures(verdicts: Sequence[Verdict], fault_kinds: Sequence[Sequence[str]]) -> dict[str, object]:
    """The issue's figures over several runs; ``fault_kinds`` lists each run's fault kinds."""
    counts: dict[str, int] = defaultdict(int)
    for kinds in fault_kinds:
        for kind in kinds:
            counts[kind] += 1
    duplicates = [count for verdict in verdicts for count in verdict.duplicates_per_fault]
    recovery: dict[str, list[float]] = defaultdict(list)
    for verdict in verdicts:
        for kind, seconds in verdict.recovery_s:
            recovery[kind].append(seconds)
    return {
        "runs": len(verdicts),
        "faults": dict(sorted(counts.items())),
        "records": sum(verdict.records for verdict in verdicts),
        "lost": sum(verdict.lost_total for verdict in verdicts),
        "overlaps": sum(len(verdict.overlaps) for verdict in verdicts),
        "frozen_in_handler": sum(len(verdict.frozen_in_handler) for verdict in verdicts),
        "duplicates_p50": percentile(duplicates, 0.5),
        "duplicates_max": max(duplicates, default=0),
        "recovery_s": {
            kind: {
                "p50": round(percentile(values, 0.5), 3),
                "p99": round(percentile(values, 0.99), 3),
            }
            for kind, values in sorted(recovery.items())
        },
    }


def runtime_figures(
    verdicts: Sequence[Verdict], *, counting: bool = False, windowed: bool = False
) -> dict[str, object]:
    """One runtime's entry in ``report``: its own losses, overlaps and duplicates, for the
    word count (``counting``) its counts, surpluses and restore check, and for the page
    views (``windowed``) its windows against the reference and its repeated final results."""
    duplicates = [count for verdict in verdicts for count in verdict.duplicates_per_fault]
    shown: dict[str, object] = {
        "runs": len(verdicts),
        "records": sum(verdict.records for verdict in verdicts),
        "ok": all(verdict.ok for verdict in verdicts),
        "lost": sum(verdict.lost_total for verdict in verdicts),
        "overlaps": sum(len(verdict.overlaps) for verdict in verdicts),
        "frozen_in_handler": sum(len(verdict.frozen_in_handler) for verdict in verdicts),
        "zombie_handouts": sum(len(verdict.zombie_handouts) for verdict in verdicts),
        "order_violations": sum(len(verdict.order_violations) for verdict in verdicts),
        "excess_duplicates": sum(len(verdict.excess_duplicates) for verdict in verdicts),
        "duplicates_p50": percentile(duplicates, 0.5),
        "duplicates_max": max(duplicates, default=0),
    }
    if counting:
        shown |= {
            "undercounted_words": sum(len(verdict.undercounted) for verdict in verdicts),
            "counts_lost": sum(verdict.counts_lost for verdict in verdicts),
            "surplus": sum(verdict.surplus for verdict in verdicts),
            "unexplained_surplus_words": sum(len(v.unexplained_surplus) for v in verdicts),
            "restore_mismatches": sum(len(verdict.restore_mismatches) for verdict in verdicts),
            "changelog_regressions": sum(len(verdict.regressions) for verdict in verdicts),
            "frozen_writes": sum(len(verdict.frozen_writes) for verdict in verdicts),
            "delayed_writes": sum(len(verdict.delayed_writes) for verdict in verdicts),
        }
    if windowed:
        shown |= {
            "windows": sum(verdict.windows for verdict in verdicts),
            "windows_lost": sum(len(verdict.undercounted) for verdict in verdicts),
            "views_lost": sum(verdict.counts_lost for verdict in verdicts),
            "surplus": sum(verdict.surplus for verdict in verdicts),
            "unexplained_surplus_windows": sum(len(v.unexplained_surplus) for v in verdicts),
            "final_repeats": sum(len(verdict.final_repeats) for verdict in verdicts),
            "final_repeats_after_crash": sum(
                len(verdict.final_repeats_after_crash) for verdict in verdicts
            ),
        }
    return shown


def report(
    by_runtime: Mapping[str, Sequence[Verdict]],
    fault_kinds: Sequence[Sequence[str]],
    *,
    counting: frozenset[str] = frozenset(),
    windowed: frozenset[str] = frozenset(),
) -> dict[str, object]:
    """The JSON line: ``figures`` over every run of every runtime (so the top-level ``lost``
    and ``overlaps`` cover them all) and a ``runtimes`` entry per runtime driven. The
    runtimes in ``counting`` always show the word count's figures, those in ``windowed``
    the page views'."""
    every = [verdict for verdicts in by_runtime.values() for verdict in verdicts]
    shown = figures(every, fault_kinds)
    shown["runtimes"] = {
        name: runtime_figures(verdicts, counting=name in counting, windowed=name in windowed)
        for name, verdicts in by_runtime.items()
    }
    return shown
