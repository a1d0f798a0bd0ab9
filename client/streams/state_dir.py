"""Which directory of ``state_dir/<application_id>/`` this process keeps its stores in.

RocksDB allows one process per database directory, so two instances of an application on one
host (the README's "four instances on one partition") must never share one. Each instance holds
an exclusive lock on its own subdirectory for as long as it runs, taken before it creates
topics or joins the group:

- with ``instance_id`` (static membership) the subdirectory is named after it, so a restarted
  instance finds its checkpoints and restores only what the changelog gained since; a second
  live process with the same id is refused at once, naming the directory and the options;
- without, an instance takes the first free ``instance-<n>``: started one after another, the
  same instances find the same directories again, and instances started side by side each get
  one of their own.

The lock is ``flock`` on a ``.lock`` file: the kernel releases it when the process dies, so a
killed instance never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
from pathlib import Path
from typing import IO

logger = logging.getLogger(__name__)

# Far more instances of one application than one host runs; past it something is wrong.
MAX_INSTANCES_PER_HOST = 256

LOCK_FILE = ".lock"


class StateDirectoryInUse(Exception):
    """Another live process holds the directory this instance must use."""


class StateDirectory:
    def __init__(self, application_dir: Path, instance_id: str | None) -> None:
        self._application_dir = application_dir
        self._instance_id = instance_id
        self._lock: IO[str] | None = None
        self.path: Path | None = None

    def claim(self) -> Path:
        """Lock this instance's directory and return it; ``StateDirectoryInUse`` when the one
        it must use (its ``instance_id``'s) is held by another process."""
        if self._instance_id is not None:
            path = self._application_dir / _directory_name(self._instance_id)
            if not self._try_lock(path):
                raise StateDirectoryInUse(
                    f"the state directory {path} is in use by another instance with "
                    f"instance_id {self._instance_id!r}; give each instance its own "
                    "--instance-id or --state-dir"
                )
            return path
        for number in range(MAX_INSTANCES_PER_HOST):
            path = self._application_dir / f"instance-{number}"
            if self._try_lock(path):
                return path
        raise StateDirectoryInUse(
            f"all {MAX_INSTANCES_PER_HOST} state directories under {self._application_dir} are "
            "in use; give this instance its own --state-dir"
        )

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file releases the flock
            self._lock = None
            self.path = None

    def _try_lock(self, path: Path) -> bool:
        path.mkdir(parents=True, exist_ok=True)
        lock = (path / LOCK_FILE).open("a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            return False
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        self._lock, self.path = lock, path
        logger.info("state directory locked", extra={"path": str(path)})
        return True


def _directory_name(instance_id: str) -> str:
    """A file name for any ``instance_id``: what a file name cannot hold becomes ``_``."""
    return "id-" + re.sub(r"[^A-Za-z0-9._-]", "_", instance_id)
