"""The embedded Postgres: a server shipped as a Python package (``pgserver``)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType
from urllib.parse import quote

from coordinator.embedded.service import (
    HAVE_PROCFS,
    EmbeddedServiceError,
    ManagedService,
    failure,
    pid_alive,
    wait_for_exit,
)

logger = logging.getLogger(__name__)


DEFAULT_POSTGRES_DIR = Path(".keyrange") / "postgres"


# pg_ctl's own default wait; a fast shutdown of a small local cluster takes well under a second.
_POSTGRES_STOP_TIMEOUT_S = 60.0


# After SIGQUIT (immediate shutdown) a postmaster exits at once; more means it is wedged.
_POSTGRES_KILL_GRACE_S = 5.0


_OWNER_FILE = "keyrange-owner.pid"


_DATABASE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,62}$")


_owners_lock = threading.Lock()


_postgres_owners: dict[Path, EmbeddedPostgres] = {}


class EmbeddedPostgres(ManagedService):
    """A local Postgres server whose data lives in ``data_dir``.

    Several processes may share one data directory: ``start()`` reuses a server already
    running there, and only the process that owns the server stops it. Ownership goes to
    the process that started it, or passes to the next one when that process died without
    stopping it, so a crashed run never leaves a server nobody will stop.

    When run as root, pgserver runs Postgres as an unprivileged ``pgserver`` user it
    creates, and widens read/traverse permissions on every parent of ``data_dir`` so that
    user can reach its files.
    """

    def __init__(self, data_dir: str | os.PathLike[str] = DEFAULT_POSTGRES_DIR) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self._socket_dir: Path | None = None
        self._system_user: str | None = None
        self._owns_server = False

    @property
    def log_path(self) -> Path:
        return self.data_dir / "log"

    @property
    def running(self) -> bool:
        return self._socket_dir is not None and self._postmaster_pid() is not None

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL over the server's unix socket: no TCP port to collide or expose."""
        if self._socket_dir is None:
            raise EmbeddedServiceError("embedded Postgres is not started")
        return (
            f"postgresql+asyncpg://postgres@/{database}"
            f"?host={quote(str(self._socket_dir), safe='/')}"
        )

    def start(self) -> str:
        """Start (or reuse) the server and return the URL of its ``postgres`` database."""
        if self.running:
            return self.url()
        started = time.monotonic()
        logger.info(
            "starting embedded Postgres in %s",
            self.data_dir,
            extra={"data_dir": str(self.data_dir)},
        )
        pgserver = _import_pgserver()
        already_running = self._postmaster_pid() is not None
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            server = pgserver.PostgresServer(self.data_dir, cleanup_mode=None)
            info = server.get_postmaster_info()
        except (OSError, subprocess.SubprocessError, AssertionError, RuntimeError) as err:
            if not already_running:
                self._kill_postmaster()
            raise failure(
                f"embedded Postgres could not start in {self.data_dir}: {err!r}", self.log_path
            ) from err
        self._socket_dir = Path(info.socket_dir)
        self._system_user = server.system_user
        self._owns_server = self._claim_ownership()
        logger.info(
            "embedded Postgres ready",
            extra={
                "data_dir": str(self.data_dir),
                "pid": info.pid,
                "owner": self._owns_server,
                "seconds": round(time.monotonic() - started, 3),
            },
        )
        return self.url()

    def create_database(self, name: str) -> str:
        """Create database ``name`` unless it exists, and return its URL."""
        if not _DATABASE_NAME.match(name):
            raise ValueError(f"database name {name!r} must match {_DATABASE_NAME.pattern}")
        if self._socket_dir is None:
            raise EmbeddedServiceError("embedded Postgres is not started")
        script = (
            "SELECT format('CREATE DATABASE %I', :'name') "
            "WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'name') \\gexec\n"
        )
        command = [
            str(_postgres_bin("psql")),
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-v",
            f"name={name}",
            "-h",
            str(self._socket_dir),
            "-U",
            "postgres",
            "-d",
            "postgres",
        ]
        try:
            subprocess.run(
                command, input=script, text=True, capture_output=True, check=True, timeout=60
            )
        except subprocess.CalledProcessError as err:
            raise EmbeddedServiceError(
                f"could not create database {name!r}: {err.stderr.strip()}"
            ) from err
        except subprocess.TimeoutExpired as err:
            raise EmbeddedServiceError(f"creating database {name!r} timed out") from err
        logger.info("embedded database ready", extra={"database": name})
        return self.url(name)

    def stop(self) -> None:
        """Stop the server if this process owns it; otherwise just let go of it."""
        if self._socket_dir is None:
            return
        self._socket_dir = None
        if not self._owns_server:
            logger.info(
                "leaving embedded Postgres running for its owner",
                extra={"data_dir": str(self.data_dir)},
            )
            return
        self._owns_server = False
        logger.info("stopping embedded Postgres", extra={"data_dir": str(self.data_dir)})
        pid = self._postmaster_pid()
        command = [
            str(_postgres_bin("pg_ctl")),
            "-D",
            str(self.data_dir),
            "-m",
            "fast",
            "-w",
            "-t",
            str(int(_POSTGRES_STOP_TIMEOUT_S)),
            "stop",
        ]
        try:
            subprocess.run(
                command,
                user=self._system_user,
                capture_output=True,
                check=True,
                timeout=_POSTGRES_STOP_TIMEOUT_S + 5,
            )
        except (subprocess.SubprocessError, OSError) as err:
            logger.warning("pg_ctl stop failed, killing the server", extra={"error": repr(err)})
            self._kill_postmaster()
        # pg_ctl returns once postmaster.pid is gone, a moment before the process exits.
        if pid is not None and not wait_for_exit(pid, _POSTGRES_KILL_GRACE_S):
            logger.warning("embedded Postgres is still exiting", extra={"pid": pid})
        self._release_ownership()

    def _postmaster_pid(self) -> int | None:
        """The running postmaster's pid, from the first line of ``postmaster.pid``."""
        try:
            first_line = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
            pid = int(first_line)
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) and _looks_like_postgres(pid) else None

    def _kill_postmaster(self) -> None:
        """Last resort after a failed start or stop: a half-started server must not linger."""
        pid = self._postmaster_pid()
        if pid is None:
            return
        # SIGQUIT is Postgres' immediate shutdown: its children exit too, and crash recovery
        # on the next start keeps the data safe.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGQUIT)
            if not wait_for_exit(pid, _POSTGRES_KILL_GRACE_S):
                os.kill(pid, signal.SIGKILL)

    def _claim_ownership(self) -> bool:
        """Own the server unless a live process, or another object in this one, owns it."""
        with _owners_lock:
            holder = _postgres_owners.get(self.data_dir)
            if holder is not None and holder is not self and holder.running:
                return False
            owner_file = self.data_dir / _OWNER_FILE
            try:
                owner_pid = int(owner_file.read_text().strip())
            except (OSError, ValueError):
                owner_pid = None
            if owner_pid is not None and owner_pid != os.getpid() and pid_alive(owner_pid):
                return False
            owner_file.write_text(f"{os.getpid()}\n")
            _postgres_owners[self.data_dir] = self
            return True

    def _release_ownership(self) -> None:
        with _owners_lock:
            if _postgres_owners.get(self.data_dir) is self:
                del _postgres_owners[self.data_dir]
            with contextlib.suppress(FileNotFoundError):
                (self.data_dir / _OWNER_FILE).unlink()


def _looks_like_postgres(pid: int) -> bool:
    """Guards against a stale ``postmaster.pid`` whose pid now belongs to another program."""
    if not HAVE_PROCFS:
        return True
    try:
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"postgres" in command_line


def _import_pgserver() -> ModuleType:
    """pgserver is an optional extra; platformdirs warns on import when XDG_RUNTIME_DIR is
    unset (containers, CI) although its fallback directory works fine."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
            import pgserver
    except ImportError as err:
        raise EmbeddedServiceError(
            "the embedded Postgres needs the 'pgserver' package: pip install 'keyrange[embedded]'"
            " (or set KEYRANGE_DATABASE_URL)"
        ) from err
    pgserver_logger = logging.getLogger("pgserver")
    # pgserver logs every command line and state probe at INFO, drowning our own lines.
    if pgserver_logger.level == logging.NOTSET:
        pgserver_logger.setLevel(logging.WARNING)
    return pgserver


def _postgres_bin(name: str) -> Path:
    from pgserver._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH) / name
