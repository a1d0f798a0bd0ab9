"""The metrics port of ``keyrange worker`` and ``keyrange streams``: it has no authentication,
so it listens on this host only unless told otherwise, as the query port does."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import httpx

from client.metrics_server import Family, MetricsServer
from client.streams import command as streams_command
from client.streams.config import StreamsConfig
from client.worker import command as worker_command
from client.worker.config import WorkerConfig


async def test_the_metrics_port_listens_on_loopback_unless_told() -> None:
    def families() -> list[Family]:
        return [Family("keyrange_probe", "a probe", samples=[((), 1.0)])]

    server = MetricsServer(0, families, asyncio.get_running_loop(), extra="worker")
    try:
        assert server._server.server_address[0] == "127.0.0.1"
        async with httpx.AsyncClient(timeout=10) as http:
            page = await http.get(f"http://127.0.0.1:{server.port}/metrics")
        assert "keyrange_probe 1.0" in page.text
    finally:
        server.close()


def test_the_metrics_host_is_a_setting_of_both_runtimes(tmp_path: Path) -> None:
    worker = WorkerConfig(topics=["t"], group_id="g", bootstrap_servers="b", coordinator_url="c")
    streams = StreamsConfig("iq-x", "b:9092", "http://c", state_dir=tmp_path)
    assert (worker.metrics_host, streams.metrics_host) == ("127.0.0.1", "127.0.0.1")
    for command in (worker_command, streams_command):
        parser = argparse.ArgumentParser()
        command.OPTIONS.add_to(parser)
        args = parser.parse_args(["--metrics-host", "0.0.0.0"])
        assert args.metrics_host == "0.0.0.0"
        environ = {
            command.OPTIONS.env(o): "x"
            for o in command.OPTIONS.table
            if o.field != "metrics_host" and o.field in command.OPTIONS.required
        }
        assert command.OPTIONS.settings(args, environ)["metrics_host"] == "0.0.0.0"
