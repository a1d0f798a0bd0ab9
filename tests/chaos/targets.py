"""What the chaos suite's ``keyrange worker`` and ``keyrange streams`` members run: a handler
and a word count that journal each call's start and end as ``tests/e2e/worker_process.py``
does for ``run()``, one ``os.write`` per line to a file opened for appending (so a SIGKILL
loses nothing, and a process-pool child's lines interleave whole with its parent's).

    keyrange worker tests.chaos.targets:handle ...
    keyrange streams tests.chaos.targets:word_count ...
    keyrange streams tests.chaos.targets:page_views ...

Set from the environment: ``CHAOS_JOURNAL`` (the journal), ``CHAOS_NAME`` (the member's
name), ``CHAOS_WORK_MS`` (each call's work), ``CHAOS_BLOCK_MS`` (how long SIGUSR1 blocks the
event loop), the word count's topics as ``examples/streams_wordcount.py`` reads them, and
the page views' as ``examples/streams_dsl_pageviews.py`` does.

A handler cannot see its member's id or how often the member lost its slices, which the
checker needs to tell one membership's run of a key from the next. So the member's main
process journals ``boot`` when it starts and ``lost`` when the consumer logs that it lost
its slices; the ledger counts them before each start (``tests/chaos/ledger.py``).

The suite's runner slows calls down through a control file next to the journal
(``<journal>.control``: JSON ``{"id": n, "until": monotonic instant, "calls": k, "sleep_s":
seconds}``): the first ``k`` calls that start before ``until`` first sleep ``sleep_s``, in
whatever thread or process they run (a stuck handler, a call past the processing timeout, a
long call meeting a SIGTERM); the others go on, so the member keeps working.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import time
from typing import Any

from client.streams import INT64, JSON, STRING, Processor, StoreSpec, Topology
from client.streams.dsl import Stream, StreamsBuilder
from examples.streams_dsl_pageviews import views_per_window

POISON = b"poison"


def _journal() -> int | None:
    path = os.environ.get("CHAOS_JOURNAL")
    return None if path is None else os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


_JOURNAL = _journal()
_NAME = os.environ.get("CHAOS_NAME", "member")
_WORK_S = float(os.environ.get("CHAOS_WORK_MS", "5")) / 1000
_BLOCK_S = float(os.environ.get("CHAOS_BLOCK_MS", "5000")) / 1000
_CONTROL = None if "CHAOS_JOURNAL" not in os.environ else f"{os.environ['CHAOS_JOURNAL']}.control"


def note(event: str, **fields: Any) -> None:
    if _JOURNAL is not None:
        line = {"e": event, "p": _NAME, "t": time.monotonic(), "w": time.time(), **fields}
        os.write(_JOURNAL, json.dumps(line).encode() + b"\n")


def control_sleep(started: float) -> None:
    """Sleep as the runner's control file asks of a call that started at ``started``."""
    asked = _asked(started)
    if asked is not None:
        time.sleep(asked)


def _asked(started: float) -> float | None:
    """How long the call should sleep: only the first ``calls`` calls that start before
    ``until`` do, each claiming a token file (whichever thread or process it runs in)."""
    if _CONTROL is None:
        return None
    try:
        with open(_CONTROL) as control:
            asked = json.load(control)
    except (OSError, ValueError):
        return None
    if started >= asked["until"]:
        return None
    for index in range(asked["calls"]):
        try:
            os.close(os.open(f"{_CONTROL}.{asked['id']}.{index}", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        return float(asked["sleep_s"])
    return None


def handle(record: Any) -> None:
    """The worker's handler: plain, module-level, so it runs in a thread or is pickled to a
    process-pool child alike. A poison record fails every attempt (``retry`` dead-letters
    it)."""
    started = time.monotonic()
    slot = {"pt": record.partition, "o": record.offset, "k": record.key.hex()}
    note("start", pid=os.getpid(), **slot)
    outcome = "error"
    try:
        control_sleep(started)
        time.sleep(_WORK_S)
        if record.value == POISON:
            raise ValueError(f"poison record p{record.partition}@{record.offset}")
        outcome = "done"
    finally:
        note("end", ok=outcome, **slot)


# The SDK's lines that say a membership ended: the membership's own (logged whatever the
# member owned) and the consumer's (logged when it dropped slices).
_LOSSES = (
    "slices lost",
    "session deadline passed without a successful heartbeat; slices are lost",
    "membership lost; rejoining",
)


class _LossJournal(logging.Handler):
    """Journals the consumer's "slices lost" line (the membership it ends is over), and the
    pool's word that a child process it killed to end a call, or that died, has exited: a
    call with no end in that process ran until then."""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message in _LOSSES:
            note("lost")
        elif message in ("slices released", "held keys released"):
            note("released")
        elif message in ("a pool process killed to end a call has exited", "a pool process died"):
            note("child_gone", pid=getattr(record, "pid", None))
        elif message.startswith("a send failed;"):
            # The instance stops without committing: a crash, for the windowed checker.
            note("crashed")


def _block_loop(signum: int, frame: object) -> None:
    """SIGUSR1: block the main thread, which runs the event loop, as a synchronous call
    would."""
    started = time.monotonic()
    time.sleep(_BLOCK_S)
    note("blocked", s=started)


if multiprocessing.parent_process() is None and _JOURNAL is not None:
    note("boot")
    # On the SDK's parent logger: whichever of its modules says it.
    logging.getLogger("client").addHandler(_LossJournal())
    signal.signal(signal.SIGUSR1, _block_loop)


class SplitLines(Processor):
    def process(self, key: str, value: str | None) -> None:
        note("split", pt=self.context.partition, o=self.context.offset)
        for word in (value or "").split():
            self.context.forward(word, 1)


class CountWords(Processor):
    """``examples/streams_wordcount.py``'s counter, journaling each word record it counts
    and the count it wrote."""

    def process(self, key: str, value: int) -> None:
        started = time.monotonic()
        slot = {"pt": self.context.partition, "o": self.context.offset, "k": key}
        note("start", **slot)
        control_sleep(started)
        counts = self.context.state_store("counts")
        count = (counts.get(key) or 0) + value
        counts.put(key, count)
        self.context.forward(key, count)
        note("end", ok="done", c=count, **slot)


def word_count() -> Topology:
    """The word count's topology (``examples/streams_wordcount.py``) with the journaling
    processors."""
    return (
        Topology()
        .add_source("lines", os.environ["WORDCOUNT_LINES"], key_serde=STRING, value_serde=STRING)
        .add_processor("split", SplitLines, "lines")
        .add_sink(
            "to-words", os.environ["WORDCOUNT_WORDS"], "split", key_serde=STRING, value_serde=INT64
        )
        .add_source("words", os.environ["WORDCOUNT_WORDS"], key_serde=STRING, value_serde=INT64)
        .add_processor("count", CountWords, "words")
        .add_state_store(StoreSpec("counts", STRING, INT64, persistent=True), "count")
        .add_sink(
            "to-counts",
            os.environ["WORDCOUNT_COUNTS"],
            "count",
            key_serde=STRING,
            value_serde=INT64,
        )
    )


class JournalViews(Processor):
    """Journals each page view around the rest of its processing: ``forward`` runs the
    windowed count (and any final result the view closes) before it returns."""

    def process(self, key: str, value: object) -> None:
        started = time.monotonic()
        slot = {"pt": self.context.partition, "o": self.context.offset, "k": key}
        note("start", **slot)
        control_sleep(started)
        self.context.forward(key, value)
        note("end", ok="done", **slot)


def _journal_final(user: str, window: dict[str, int]) -> None:
    note("final", k=user, s=window["start"], n=window["views"])


def page_views() -> Topology:
    """The page views' topology (``examples/streams_dsl_pageviews.py``: its windowed count,
    final results, RocksDB window store) between a processor journaling each view and a
    step journaling each final result as it goes to the sink."""
    builder = StreamsBuilder()
    source = builder.stream(
        os.environ["PAGEVIEWS_INPUT"], key_serde=STRING, value_serde=JSON, name="views"
    )
    builder.topology.add_processor("journal-views", JournalViews, source.node)
    views = Stream(builder, "journal-views", STRING, JSON)
    views_per_window(views).peek(_journal_final, name="journal-finals").to(
        os.environ["PAGEVIEWS_OUTPUT"]
    )
    return builder.build()
