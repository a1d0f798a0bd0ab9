"""How the coordinator's logs look: text on a terminal, with the block that says where the
coordinator, its console, docs and broker are set apart in bold; JSON anywhere else (a
container's log collector); KEYRANGE_LOG_FORMAT decides when set, NO_COLOR turns colour off.
Tried on a real pseudo-terminal and a real pipe, and with ``keyrange serve`` itself."""

from __future__ import annotations

import io
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from coordinator import logs
from tests.fixtures.coordinator import free_port

BOLD_GREEN = "\033[1;32m"


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def read_available(fd: int, until: bytes, timeout_s: float = 10) -> bytes:
    """What ``fd`` gives until ``until`` has been read, or the deadline passed."""
    seen = b""
    deadline = time.monotonic() + timeout_s
    while until not in seen:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            break
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # a pty's reader gets EIO once every writer has closed it
            break
        if not chunk:
            break
        seen += chunk
    return seen


def logged_on_terminal(fmt: str) -> str:
    controller, terminal_end = os.openpty()
    with open(terminal_end, "w") as terminal:
        output = logs.configure("INFO", fmt, terminal)
        logging.getLogger("keyrange.test").warning("disk almost full", extra={"free": "1%"})
        output.announce("Keyrange coordinator starting", {"url": "http://127.0.0.1:8080"})
    text = read_available(controller, b"http://127.0.0.1:8080").decode()
    os.close(controller)
    return text


def logged_on_pipe(fmt: str) -> str:
    read_end, write_end = os.pipe()
    with open(write_end, "w") as pipe:
        output = logs.configure("INFO", fmt, pipe)
        logging.getLogger("keyrange.test").warning("disk almost full", extra={"free": "1%"})
        output.announce("Keyrange coordinator starting", {"url": "http://127.0.0.1:8080"})
    with open(read_end) as pipe:
        return pipe.read()


def json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.mark.usefixtures("restored_logging")
def test_auto_is_coloured_text_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    text = logged_on_terminal("auto")
    assert "\033[33mwarning\033[0m keyrange.test: disk almost full  free=1%" in text
    assert f"{BOLD_GREEN}Keyrange coordinator starting\033[0m" in text
    assert f"{BOLD_GREEN}  url  http://127.0.0.1:8080\033[0m" in text
    assert "{" not in text


@pytest.mark.usefixtures("restored_logging")
def test_auto_is_json_on_a_pipe() -> None:
    warning, announced = json_lines(logged_on_pipe("auto"))
    assert (warning["level"], warning["msg"], warning["free"]) == (
        "warning",
        "disk almost full",
        "1%",
    )
    assert (announced["msg"], announced["url"]) == (
        "Keyrange coordinator starting",
        "http://127.0.0.1:8080",
    )


@pytest.mark.usefixtures("restored_logging")
def test_http_requests_are_not_logged_one_line_each_at_info() -> None:
    """A worker heartbeats about once a second: httpx's INFO line per request would be most
    of its log, forever. Its warnings still come through."""
    stream = io.StringIO()
    logs.configure("INFO", "json", stream)
    logging.getLogger("httpx").info("HTTP Request: POST /v1/groups/g/heartbeat 200")
    logging.getLogger("httpx").warning("connection pool full")
    assert [line["msg"] for line in json_lines(stream.getvalue())] == ["connection pool full"]


@pytest.mark.usefixtures("restored_logging")
def test_a_format_set_wins_over_the_terminal_and_no_color_turns_colour_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert json_lines(logged_on_terminal("json"))[0]["msg"] == "disk almost full"
    piped = logged_on_pipe("text")
    assert "warning keyrange.test: disk almost full  free=1%" in piped
    assert "\n  url  http://127.0.0.1:8080\n" in piped and "\033[" not in piped
    monkeypatch.setenv("NO_COLOR", "1")
    plain = logged_on_terminal("auto")
    assert "warning keyrange.test: disk almost full" in plain and "\033[" not in plain


def serve(
    stderr: int, database_url: str, kafka_bootstrap: str, tmp_path: Path, **settings: str
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    environment = {
        name: value for name, value in os.environ.items() if not name.startswith("KEYRANGE_")
    }
    environment.pop("NO_COLOR", None)
    environment.update(
        KEYRANGE_DATABASE_URL=database_url,
        KEYRANGE_KAFKA_BOOTSTRAP=kafka_bootstrap,
        KEYRANGE_PORT=str(port),
        KEYRANGE_DATA_DIR=str(tmp_path / "data"),
        **settings,
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "coordinator", "serve"],
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )
    return process, port


def stop_when_ready(process: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, "serve exited before it was ready"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "serve was not ready in 60 s"
        time.sleep(0.2)  # the poll interval of a wait with a deadline
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0


@pytest.mark.db
@pytest.mark.kafka
def test_serve_on_a_terminal_writes_text_with_where_it_is_set_apart(
    database_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    controller, terminal_end = os.openpty()
    process, port = serve(terminal_end, database_url, kafka_bootstrap, tmp_path)
    os.close(terminal_end)
    try:
        stop_when_ready(process, port)
        text = read_available(controller, b"stopped on SIGTERM").decode()
    finally:
        if process.poll() is None:
            process.kill()
        os.close(controller)
    base = f"http://127.0.0.1:{port}"
    assert f"{BOLD_GREEN}Keyrange coordinator starting\033[0m" in text
    for line in (f"url      {base}", f"console  {base}/ui", f"docs     {base}/docs"):
        assert f"{BOLD_GREEN}  {line}\033[0m" in text, text
    assert f"kafka    {kafka_bootstrap}" in text
    assert " info    uvicorn.error: Application startup complete." in text
    assert not [line for line in text.splitlines() if line.startswith("{")], text


@pytest.mark.db
@pytest.mark.kafka
def test_serve_into_a_pipe_writes_json_with_where_it_is_as_fields(
    database_url: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    process, port = serve(subprocess.PIPE, database_url, kafka_bootstrap, tmp_path)
    try:
        stop_when_ready(process, port)
        assert process.stderr is not None
        lines = process.stderr.read().decode().splitlines()
    finally:
        if process.poll() is None:
            process.kill()
    records = [json.loads(line) for line in lines]
    assert records[-1]["msg"] == "stopped on SIGTERM"
    (announced,) = [r for r in records if r["msg"] == "Keyrange coordinator starting"]
    assert announced["console"] == f"http://127.0.0.1:{port}/ui"
    assert announced["kafka"] == kafka_bootstrap


@pytest.mark.usefixtures("restored_logging")
def test_kafka_client_repeats_are_folded_and_counted_into_the_next_one_shown() -> None:
    """With the broker down aiokafka logs ~40 ERROR lines a second (issue 47 item 6): one of
    each kind is shown per 10 s, the next carries how many were left out, and Keyrange's
    own lines are never folded."""
    stream = io.StringIO()
    logs.configure("INFO", "json", stream)
    now = [0.0]
    handler = logging.getLogger().handlers[0]
    handler.filters[:] = [logs.FoldRepeats(window_s=10.0, clock=lambda: now[0])]
    conn = logging.getLogger("aiokafka.conn")
    for attempt in range(40):
        conn.error("Unable connect to %r: %r", "127.0.0.1:9092", f"refused {attempt}")
        logging.getLogger("client.consumer").warning("Kafka unreachable; retrying")
    now[0] = 10.5
    conn.error("Unable connect to %r: %r", "127.0.0.1:9092", "refused 40")
    shown = json_lines(stream.getvalue())
    kafka = [line for line in shown if line["logger"] == "aiokafka.conn"]
    ours = [line for line in shown if line["logger"] == "client.consumer"]
    assert len(ours) == 40
    assert [line["msg"] for line in kafka] == [
        "Unable connect to '127.0.0.1:9092': 'refused 0'",
        "Unable connect to '127.0.0.1:9092': 'refused 40'",
    ]
    assert "folded" not in kafka[0]
    assert kafka[1]["folded"] == "39 more like it since the last one shown"
