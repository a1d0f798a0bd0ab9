"""The names docs/architecture.md's glossary retired stay out of the shipped code, as
tests/test_readme.py holds every setting to the README: one name per role and one verb per
event, or the glossary is a wish.

Only names the glossary's "once" columns retired and that nothing else means are listed; a word
the glossary kept for another role (``give_back``, ``forget``, ``still_owned``, the task state
``HALTED``) is not. Identifiers are read from Python's tokens, so prose in comments that
happens to use a word does not count; names of asyncio tasks are read from string literals."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).parent.parent
SHIPPED = ("client", "coordinator")

# Retired identifier -> the glossary's name for it.
RETIRED_NAMES = {
    "WorkerEngine": "WorkerRuntime",
    "StreamEngine": "StreamsRuntime",
    "open_engine": "open_backend",
    "withdraw": "revoking / give back / drop",
    "_withdraw": "revoking",
    "withhold": "lost",
    "lose": "lost",
    "lose_all": "lost",
    "drop_lost": "dropped",
    "_detach": "disowned",
    "_give_back": "give_back",
    "open_partitions": "assigned",
    "close_partitions": "revoked",
    "stop_workers": "runners",
}
# Retired words inside string literals (the runners' task names) -> the glossary's name.
RETIRED_STRINGS = {"keyrange-worker-": "runner"}

# Files other engineers are rewriting in issue 48 (steps 1, 3 and 5: the per-key scheduler,
# the lifecycle and the consumer's state), where a retired name still stands; each entry
# lists the names it may still hold, and goes when that step lands.
KNOWN_EXCEPTIONS = {
    "client/ownership.py": {"lose"},
    "client/membership/reconcile.py": {"lose"},
    "client/membership/heartbeat.py": {"lose"},
    "client/worker/partitions.py": {"open_partitions", "close_partitions"},
    "client/worker/runtime.py": {
        "open_partitions",
        "close_partitions",
        "stop_workers",
        "keyrange-worker-",
    },
    "client/dispatch.py": {"keyrange-worker-"},
}


# Python 3.12 splits an f-string into parts; 3.11 gives one STRING token.
_STRINGS = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}


def retired_uses() -> dict[str, set[str]]:
    """The retired names each shipped module uses."""
    found: dict[str, set[str]] = {}
    for package in SHIPPED:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text()
            used = set()
            for token in tokenize.generate_tokens(io.StringIO(source).readline):
                if token.type == tokenize.NAME and token.string in RETIRED_NAMES:
                    used.add(token.string)
                elif token.type in _STRINGS:
                    used |= {word for word in RETIRED_STRINGS if word in token.string}
            if used:
                found[str(path.relative_to(ROOT))] = used
    return found


def test_no_shipped_module_uses_a_retired_name() -> None:
    unexpected = {
        module: sorted(used - KNOWN_EXCEPTIONS.get(module, set()))
        for module, used in retired_uses().items()
        if used - KNOWN_EXCEPTIONS.get(module, set())
    }
    assert unexpected == {}, {
        module: [
            f"{word} (now: {RETIRED_NAMES.get(word) or RETIRED_STRINGS[word]})" for word in used
        ]
        for module, used in unexpected.items()
    }


def test_the_known_exceptions_still_hold_what_they_excuse() -> None:
    """An exception whose file no longer uses the name goes, so the list only shrinks."""
    uses = retired_uses()
    stale = {
        module: sorted(words - uses.get(module, set()))
        for module, words in KNOWN_EXCEPTIONS.items()
        if words - uses.get(module, set())
    }
    assert stale == {}


def test_the_retired_names_are_the_glossarys() -> None:
    glossary = (ROOT / "docs" / "architecture.md").read_text().split("## Glossary", 1)[1]
    missing = [word for word in (*RETIRED_NAMES, *RETIRED_STRINGS) if word not in glossary]
    assert missing == []
