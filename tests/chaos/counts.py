"""The word count's invariants, judged from what was produced, the ledger, the sink and the
changelog (no I/O here: tested on hand-made inputs).

At-least-once may count a word twice, never lose one:

- every word's final count (the sink's last value) is at least its true count (its
  occurrences in the lines produced);
- every surplus is explained by inputs the ledger shows processed more than once: a line
  split twice adds its words again, a word record counted twice adds one;
- a restore from the changelog alone (its last value per word) equals the final counts;
- a word's count never goes down in the changelog: a lower value after a higher one is a
  write that landed after a newer one (a task writing after its range moved on), and a
  restore at that point loses counts even when later writes hide it. Only the documented
  exception (docs/guarantees.md, "Streams") is excused, counted apart: a write its process
  had handed to its producer when it was stopped (SIGSTOP), or while its link to the broker
  was cut, so that the producer delivered it after the heir's writes. No client without a
  transactional producer can recall a batch it handed over.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tests.chaos.ledger import HandlerRun

# A write journaled this close to its process's freeze may have been on its way to the
# producer when the process was stopped.
FROZEN_SEND_S = 1.0


@dataclass(frozen=True)
class Write:
    """A count the word count's processor wrote (``tests/chaos/targets.py`` journals it)."""

    process: str
    word: str
    count: int
    at: float


@dataclass
class CountVerdict:
    undercounted: list[str] = field(default_factory=list)
    unexplained_surplus: list[str] = field(default_factory=list)
    restore_mismatches: list[str] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)
    frozen_writes: list[str] = field(default_factory=list)
    delayed_writes: list[str] = field(default_factory=list)
    # Over all words: the counts below the truth, and above it.
    counts_lost: int = 0
    surplus: int = 0


def true_counts(lines: Iterable[bytes]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for text in lines:
        counts.update(text.decode().split())
    return counts


def explained_surplus(
    lines: Mapping[tuple[int, int], bytes],
    splits: Sequence[tuple[int, int]],
    counted: Sequence[HandlerRun],
) -> Counter[str]:
    """Per word, how much the inputs processed more than once may have added: every split
    of a line after its first adds the line's words, every count of a word record after its
    first adds one (a call that began counts, finished or not: it may have written)."""
    explained: Counter[str] = Counter()
    for slot, times in Counter(splits).items():
        for _ in range(times - 1):
            explained.update(lines.get(slot, b"").decode().split())
    for (_, _, word), times in Counter((r.partition, r.offset, r.key) for r in counted).items():
        explained[word] += times - 1
    return explained


def check_counts(
    lines: Mapping[tuple[int, int], bytes],
    splits: Sequence[tuple[int, int]],
    counted: Sequence[HandlerRun],
    final: Mapping[str, int],
    restored: Mapping[str, int],
    changelog: Mapping[str, Sequence[int]] | None = None,
    writes: Sequence[Write] = (),
    frozen: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    cut_off: Mapping[str, Sequence[tuple[float, float]]] | None = None,
) -> CountVerdict:
    """``lines`` is every line produced (by partition and offset), ``splits`` each split the
    ledger shows, ``counted`` each count call, ``final`` the sink's last value per word,
    ``restored`` the changelog's; ``changelog`` every value of each word in the changelog's
    order, ``writes`` the counts the ledger shows written, ``frozen`` when each process
    was stopped (SIGSTOP), ``cut_off`` when each process's link to the broker was cut."""
    truth = true_counts(lines.values())
    explained = explained_surplus(lines, splits, counted)
    verdict = CountVerdict()
    for word in sorted(set(truth) | set(final)):
        true, got = truth.get(word, 0), final.get(word, 0)
        if got < true:
            verdict.undercounted.append(f"{word}: counted {got}, produced {true}")
            verdict.counts_lost += true - got
        elif got > true:
            verdict.surplus += got - true
            if got - true > explained[word]:
                verdict.unexplained_surplus.append(
                    f"{word}: counted {got}, produced {true}, inputs processed twice "
                    f"explain {explained[word]}"
                )
    for word in sorted(set(final) | set(restored)):
        if final.get(word) != restored.get(word):
            verdict.restore_mismatches.append(
                f"{word}: the sink ends at {final.get(word)}, the changelog at {restored.get(word)}"
            )
    for word, values in sorted((changelog or {}).items()):
        for before, after in itertools.pairwise(values):
            if after < before:
                _judge_regression(verdict, word, before, after, writes, frozen or {}, cut_off or {})
    return verdict


def _judge_regression(
    verdict: CountVerdict,
    word: str,
    before: int,
    after: int,
    writes: Sequence[Write],
    frozen: Mapping[str, Sequence[tuple[float, float]]],
    cut_off: Mapping[str, Sequence[tuple[float, float]]],
) -> None:
    writers = [write for write in writes if write.word == word and write.count == after]
    found = f"{word}: the changelog goes from {before} to {after}, written by " + (
        ", ".join(f"{write.process} at {write.at:.3f}" for write in writers) or "no call journaled"
    )
    if _handed_over_during(writers, frozen, after_s=FROZEN_SEND_S):
        verdict.frozen_writes.append(found)
    elif _handed_over_during(writers, cut_off, after_s=0.0):
        verdict.delayed_writes.append(found)
    else:
        verdict.regressions.append(found)


def _handed_over_during(
    writers: Sequence[Write], faults: Mapping[str, Sequence[tuple[float, float]]], after_s: float
) -> bool:
    """Whether a write was journaled during a fault of its own process, or within
    ``FROZEN_SEND_S`` before it began (still in the producer when it struck) or ``after_s``
    after it ended."""
    return any(
        start - FROZEN_SEND_S <= write.at <= end + after_s
        for write in writers
        for start, end in faults.get(write.process, ())
    )
