"""The page views' invariants (``streams-windowed``), judged from the views produced, the
ledger, the journaled final results and the output topic (no I/O here: tested on hand-made
inputs).

The reference is plain Python: each view produced counts once in its user's tumbling window
(``timestamp // window * window``). Every final result on the output topic is then judged:

- **lost:** a window of the reference with no final result, or one below its reference;
- **double-counted:** a final result above its reference is a finding unless inputs the
  ledger shows processed more than once explain the surplus (a view processed twice may
  count twice in a window still open at a crash, as any aggregate under at-least-once);
- **a final result emitted twice** is a finding, except in the one case docs/guarantees.md
  names: the instance that emitted it crashed (SIGKILL, a lost session, a failed send) after
  emitting it and before the result's next emission, so the commit that writes the window's
  final mark (after the result's acknowledgement) may not have completed. Those repeats are
  counted apart (``final_repeats_after_crash``). The judge does not see commits, so it
  excuses a crash at any time before the next emission, a superset of the documented case;
- **a result for a window the reference does not have** (a window of the closing views,
  still open at the end, or of no view at all) is a finding.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tests.chaos.ledger import HandlerRun

Window = tuple[str, int]


@dataclass(frozen=True)
class FinalResult:
    """A record of the output topic: a user's window (by its start) and its count."""

    user: str
    start: int
    views: int


@dataclass(frozen=True)
class Emission:
    """A final result as the instance journaled it on its way to the sink."""

    process: str
    user: str
    start: int
    views: int
    at: float


@dataclass
class WindowVerdict:
    windows: int = 0
    undercounted: list[str] = field(default_factory=list)
    unexplained_surplus: list[str] = field(default_factory=list)
    final_repeats: list[str] = field(default_factory=list)
    final_repeats_after_crash: list[str] = field(default_factory=list)
    # Over all windows: views below the reference, and above it.
    counts_lost: int = 0
    surplus: int = 0


def reference(views: Mapping[tuple[int, int], tuple[str, int]], window_ms: int) -> Counter[Window]:
    """Each window's true count: the views produced with their timestamps."""
    counts: Counter[Window] = Counter()
    for user, stamp in views.values():
        counts[(user, stamp // window_ms * window_ms)] += 1
    return counts


def explained_surplus(
    views: Mapping[tuple[int, int], tuple[str, int]], runs: Sequence[HandlerRun], window_ms: int
) -> Counter[Window]:
    """Per window, how much views processed more than once may have added: one per call
    after a view's first (a call that began counts, finished or not: it may have written)."""
    explained: Counter[Window] = Counter()
    for slot, times in Counter((run.partition, run.offset) for run in runs).items():
        if slot in views and times > 1:
            user, stamp = views[slot]
            explained[(user, stamp // window_ms * window_ms)] += times - 1
    return explained


def check_windows(
    views: Mapping[tuple[int, int], tuple[str, int]],
    window_ms: int,
    runs: Sequence[HandlerRun],
    results: Sequence[FinalResult],
    emissions: Sequence[Emission] = (),
    crashes: Mapping[str, Sequence[float]] | None = None,
) -> WindowVerdict:
    """``views`` is every view produced but the closing ones (by partition and offset: user,
    timestamp), ``runs`` the ledger's calls, ``results`` the output topic's records,
    ``emissions`` the final results the instances journaled, ``crashes`` when each member
    process crashed or lost its session."""
    truth = reference(views, window_ms)
    explained = explained_surplus(views, runs, window_ms)
    verdict = WindowVerdict(windows=len(truth))
    emitted: dict[Window, list[int]] = defaultdict(list)
    for result in results:
        emitted[(result.user, result.start)].append(result.views)
    for window in sorted(set(truth) | set(emitted)):
        true, got = truth.get(window, 0), emitted.get(window, [])
        name = f"{window[0]}@{window[1]}"
        if not got:
            verdict.undercounted.append(f"{name}: no final result, {true} views produced")
            verdict.counts_lost += true
            continue
        for count in got:
            if count < true:
                verdict.undercounted.append(f"{name}: final {count}, {true} views produced")
                verdict.counts_lost += true - count
            elif count > true:
                verdict.surplus += count - true
                if count - true > explained[window]:
                    verdict.unexplained_surplus.append(
                        f"{name}: final {count}, {true} views produced, views processed "
                        f"twice explain {explained[window]}"
                    )
    journaled: dict[Window, list[Emission]] = defaultdict(list)
    for emission in emissions:
        journaled[(emission.user, emission.start)].append(emission)
    for window, got in sorted(emitted.items()):
        if len(got) > 1:
            _judge_repeats(verdict, window, len(got) - 1, journaled[window], crashes or {})
    return verdict


def _judge_repeats(
    verdict: WindowVerdict,
    window: Window,
    repeats: int,
    journaled: Sequence[Emission],
    crashes: Mapping[str, Sequence[float]],
) -> None:
    """A window's emissions after its first: as many as crashes of the emitting process fell
    between one emission and the next are the documented exception; the rest are
    findings."""
    excused = []
    for before, after in itertools.pairwise(sorted(journaled, key=lambda e: e.at)):
        crash = next(
            (at for at in sorted(crashes.get(before.process, ())) if before.at < at <= after.at),
            None,
        )
        if crash is not None:
            excused.append(
                f"{window[0]}@{window[1]}: emitted by {before.process} at {before.at:.3f}, "
                f"which crashed {crash - before.at:.3f} s later; again by {after.process} "
                f"at {after.at:.3f}"
            )
    verdict.final_repeats_after_crash.extend(excused[:repeats])
    if repeats > len(excused):
        verdict.final_repeats.append(
            f"{window[0]}@{window[1]}: emitted {repeats + 1} times, "
            f"{len(excused)} of them again after its emitter crashed"
        )
