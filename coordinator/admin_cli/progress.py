"""A waiting line on stderr while a call to the coordinator takes a while, so a long reset or
describe does not look hung. Only on a terminal: a script's stderr stays clean."""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import Self, TextIO

# Quick calls show nothing; the line appears only once the wait is noticeable.
_SHOW_AFTER_S = 0.5
_REFRESH_S = 0.2
_FRAMES = "|/-\\"


class Progress:
    def __init__(self, doing: str, stream: TextIO | None = None) -> None:
        self.doing = doing
        self.stream = stream if stream is not None else sys.stderr
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = False

    def __enter__(self) -> Self:
        if self.stream.isatty():
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if self._shown:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def _run(self) -> None:
        started = time.monotonic()
        if self._done.wait(_SHOW_AFTER_S):
            return
        frame = 0
        while not self._done.is_set():
            elapsed = time.monotonic() - started
            self.stream.write(f"\r{_FRAMES[frame % len(_FRAMES)]} {self.doing} ({elapsed:.0f} s)")
            self.stream.flush()
            self._shown = True
            frame += 1
            self._done.wait(_REFRESH_S)
