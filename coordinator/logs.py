"""Structured logs: one JSON object per line in production, readable text for a terminal.
Fields passed through ``extra=`` become keys of the JSON object.

The format "auto" (the coordinator's default) is text when stderr is a terminal and JSON
otherwise, so a container's log collector gets JSON without being told, and a person running
``keyrange serve`` gets lines to read. Colour only on a terminal, and never with NO_COLOR set
(no-color.org)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

# uvicorn adds a copy of each message with terminal colours; it is noise in structured logs.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "color_message",
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                payload[key] = value
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


# ANSI SGR codes: a level's colour, and bold for the line that says where things are.
_LEVEL_COLOURS = {"WARNING": "33", "ERROR": "31", "CRITICAL": "1;31"}
_BOLD_GREEN = "1;32"


def _paint(text: str, code: str | None) -> str:
    return f"\033[{code}m{text}\033[0m" if code else text


class TextFormatter(logging.Formatter):
    """``03:21:47.120 info    keyrange: message  key=value``; level names coloured when
    ``colour``."""

    def __init__(self, colour: bool = False) -> None:
        super().__init__()
        self.colour = colour

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(
            f"{key}={value}"
            for key, value in record.__dict__.items()
            if key not in _STANDARD and not key.startswith("_")
        )
        clock = datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]
        level = _paint(
            f"{record.levelname.lower():7}",
            _LEVEL_COLOURS.get(record.levelname) if self.colour else None,
        )
        line = f"{clock} {level} {record.name}: {record.getMessage()}"
        if fields:
            line = f"{line}  {fields}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


class FoldRepeats(logging.Filter):
    """Lets one record a ``window_s`` through per (logger, level, message template) of Kafka's
    client libraries, and counts the rest into the next one let through (``folded``).

    With the broker down aiokafka logs each failed connection and metadata refresh, about 40
    ERROR lines a second, which buries the few lines of Keyrange's own that say what is wrong
    and what it does about it. The first of each kind still shows at once."""

    PREFIXES = ("aiokafka", "kafka")

    def __init__(self, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self._window_s = window_s
        self._clock = clock
        self._shown_at: dict[tuple[str, int, object], float] = {}
        self._folded: dict[tuple[str, int, object], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.PREFIXES):
            return True
        kind = (record.name, record.levelno, record.msg)
        now = self._clock()
        shown_at = self._shown_at.get(kind)
        if shown_at is not None and now - shown_at < self._window_s:
            self._folded[kind] = self._folded.get(kind, 0) + 1
            return False
        self._shown_at[kind] = now
        folded = self._folded.pop(kind, 0)
        if folded:
            record.folded = f"{folded} more like it since the last one shown"
        return True


LOG_FORMATS = frozenset({"auto", "json", "text"})


def resolved_format(fmt: str, stream: TextIO) -> str:
    """The format to write, "json" or "text": "auto" is text on a terminal, JSON elsewhere."""
    if fmt != "auto":
        return fmt
    return "text" if stream.isatty() else "json"


@dataclass(frozen=True)
class LogOutput:
    """Where and how the logs go, for the one message that is more than a log line."""

    fmt: str
    stream: TextIO
    colour: bool

    def announce(self, title: str, places: Mapping[str, str]) -> None:
        """Say where the coordinator and what it serves can be reached: a log record with the
        places as fields in JSON; in text, a block set apart from the log lines (bold on a
        terminal), since it is the line a person looks for."""
        if self.fmt == "json":
            logging.getLogger("keyrange").info(title, extra=dict(places))
            return
        width = max(len(name) for name in places)
        lines = [title, *(f"  {name.ljust(width)}  {where}" for name, where in places.items())]
        code = _BOLD_GREEN if self.colour else None
        block = "\n".join(_paint(line, code) for line in lines)
        self.stream.write(f"\n{block}\n\n")
        self.stream.flush()


def configure(level: str, fmt: str, stream: TextIO | None = None) -> LogOutput:
    """Send every log record to ``stream`` (stderr) in ``fmt``: "json", "text" or "auto"."""
    out = stream if stream is not None else sys.stderr
    chosen = resolved_format(fmt, out)
    colour = chosen == "text" and out.isatty() and not os.environ.get("NO_COLOR")
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter() if chosen == "json" else TextFormatter(colour))
    handler.addFilter(FoldRepeats())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # httpx logs every request at INFO: a worker heartbeating would print a line a second.
    for noisy in ("uvicorn.access", "aiokafka", "kafka", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))
    return LogOutput(chosen, out, colour)
