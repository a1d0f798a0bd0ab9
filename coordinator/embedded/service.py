"""What the embedded services share: the managed-service life cycle, the error that
explains a failure with the tail of the service's own log, and the process helpers that keep
a child from outliving us."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import re
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

logger = logging.getLogger(__name__)


# Enough lines of a service's own log to show the real cause (a bad flag, a port in use,
# a permission problem) without burying the message.
LOG_TAIL_LINES = 30


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


class EmbeddedServiceError(Exception):
    """An embedded service could not be started, used or stopped."""


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    tail = ANSI_ESCAPE.sub("", text).splitlines()[-lines:]
    return "\n".join(tail) if tail else f"(log {path} is empty)"


def failure(message: str, log_path: Path) -> EmbeddedServiceError:
    return EmbeddedServiceError(
        f"{message}\n--- last lines of {log_path} ---\n{log_tail(log_path)}"
    )


class ManagedService(ABC):
    """Start on entering and stop on leaving, in sync or async code; the async form runs the
    blocking start and stop in a worker thread so the event loop keeps serving."""

    @abstractmethod
    def start(self) -> str: ...

    @abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)


HAVE_PROCFS = Path("/proc/self/stat").exists()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        # Without procfs (macOS) the kill() probe is all we have; with it, the process just
        # exited between the two looks.
        return not HAVE_PROCFS
    # A zombie has exited and only waits for its parent (often init) to reap it.
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def wait_for_exit(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


PR_SET_PDEATHSIG = 1


def die_with_parent_hook() -> Callable[[], None] | None:
    """A pre-exec hook asking Linux to SIGKILL the child when the starting thread exits.

    Only used from the main thread: a worker thread (``asyncio.to_thread``) may exit long
    before the process does, and would take the broker with it.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    libc_name = ctypes.util.find_library("c")
    if libc_name is None or not hasattr(os, "getppid"):
        return None
    try:
        prctl = ctypes.CDLL(libc_name, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)

    return hook
