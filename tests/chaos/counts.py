"""The word count's invariants, judged from what was produced, the ledger, the sink and the
changelog (no I/O here: tested on hand-made inputs).

At-least-once may count a word twice, never lose one:

- every word's final count (the sink's last value) is at least its true count (its
  occurrences in the lines produced);
- every surplus is explained by inputs the ledger shows processed more than once: a line
  split twice adds its words again, a word record counted twice adds one;
- a restore from the changelog alone (its last value per word) equals the final counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tests.chaos.ledger import HandlerRun


@dataclass
class CountVerdict:
    undercounted: list[str] = field(default_factory=list)
    unexplained_surplus: list[str] = field(default_factory=list)
    restore_mismatches: list[str] = field(default_factory=list)
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
) -> CountVerdict:
    """``lines`` is every line produced (by partition and offset), ``splits`` each split the
    ledger shows, ``counted`` each count call, ``final`` the sink's last value per word,
    ``restored`` the changelog's."""
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
    return verdict
