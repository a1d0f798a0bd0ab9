"""`keyrange streams` refuses bad options and targets with one line and exit code 2, and
takes the worker's Kafka security options under its own prefix, for every Kafka client the
application opens."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from client.kafka_security import KafkaSecurity
from client.streams import StreamsApp
from client.streams import command as streams_command
from client.streams.config import StreamsConfig
from examples import streams_join
from tests.fixtures.services import MakeTopic
from tests.streams.harness import ROOT, StreamsProcess, TopicReader, produce, start_streams
from tests.waiting import until

REQUIRED = (
    "examples.streams_join:build_topology",
    "--application-id",
    "a",
    "--bootstrap",
    "b",
    "--coordinator",
    "c",
)
PASSWORD = "pa55-never-printed"


def streams(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "client.cli", "streams", *argv],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("KEYRANGE_STREAMS_")},
            **(env or {}),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["examples.streams_wordcount:build_topology"], "missing --application-id"),
        (
            ["nowhere:build", "--application-id", "a", "--bootstrap", "b", "--coordinator", "c"],
            "cannot import nowhere",
        ),
        (
            [
                "examples.streams_join:Processor",
                "--application-id",
                "a",
                "--bootstrap",
                "b",
                "--coordinator",
                "c",
            ],
            "not a Topology",
        ),
        (
            [
                "examples.streams_join:build_topology",
                "--application-id",
                "bad id!",
                "--bootstrap",
                "b",
                "--coordinator",
                "c",
            ],
            "application_id",
        ),
        (
            ["examples.streams_join:build_topology", "--commit-interval-ms", "soon"],
            "--commit-interval-ms",
        ),
        ((*REQUIRED, "--max-buffered-bytes", "0"), "max_buffered_bytes must be at least 1"),
        (
            (*REQUIRED, "--num-standby-replicas", "-1"),
            "num_standby_replicas must not be negative",
        ),
    ],
)
def test_bad_options_exit_2_with_one_line(argv: list[str], message: str) -> None:
    result = streams(*argv)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            (*REQUIRED, "--kafka-security-protocol", "KERBEROS"),
            {},
            "kafka_security_protocol 'KERBEROS' is not one of PLAINTEXT",
        ),
        ((*REQUIRED, "--kafka-security-protocol", "SASL_SSL"), {}, "needs kafka_sasl_mechanism"),
        (
            REQUIRED,
            {"KEYRANGE_STREAMS_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"},
            "needs kafka_sasl_mechanism",
        ),
        (
            REQUIRED,
            {"KEYRANGE_STREAMS_KAFKA_SSL_CAFILE": "/nonexistent/ca.pem"},
            "kafka_ssl_cafile is set but kafka_security_protocol PLAINTEXT does not use TLS",
        ),
        (
            (*REQUIRED, "--kafka-ssl-check-hostname", "maybe"),
            {},
            "--kafka-ssl-check-hostname: invalid value",
        ),
    ],
)
def test_bad_kafka_security_exits_2_with_one_line(
    argv: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    result = streams(*argv, env=env)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2
    assert len(lines) == 1 and lines[0].startswith("keyrange streams: ") and message in lines[0]


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    streams_command.add_parser(parser.add_subparsers())
    return parser.parse_args(["streams", *argv])


def test_security_comes_from_the_variables_and_a_flag_wins_over_its_variable() -> None:
    environ = {
        "KEYRANGE_STREAMS_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "KEYRANGE_STREAMS_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
        "KEYRANGE_STREAMS_KAFKA_SASL_USERNAME": "from-the-variable",
        "KEYRANGE_STREAMS_KAFKA_SASL_PASSWORD": PASSWORD,
    }
    config = StreamsConfig(
        **streams_command.settings(parsed(*REQUIRED, "--kafka-sasl-username", "app"), environ)
    )
    assert config.kafka_security == KafkaSecurity(
        protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="app",
        sasl_password=PASSWORD,
    )
    assert PASSWORD not in repr(config)


def test_the_byte_bound_comes_from_a_flag_or_its_variable() -> None:
    settings = streams_command.settings(
        parsed(*REQUIRED), {"KEYRANGE_STREAMS_MAX_BUFFERED_BYTES": "1048576"}
    )
    assert StreamsConfig(**settings).max_buffered_bytes == 1 << 20
    settings = streams_command.settings(parsed(*REQUIRED, "--max-buffered-bytes", "4096"), {})
    assert StreamsConfig(**settings).max_buffered_bytes == 4096


def test_standby_replicas_default_to_none_and_come_from_a_flag_or_its_variable() -> None:
    assert StreamsConfig("a", "b", "c").num_standby_replicas == 0
    settings = streams_command.settings(
        parsed(*REQUIRED), {"KEYRANGE_STREAMS_NUM_STANDBY_REPLICAS": "2"}
    )
    assert StreamsConfig(**settings).num_standby_replicas == 2
    settings = streams_command.settings(parsed(*REQUIRED, "--num-standby-replicas", "1"), {})
    assert StreamsConfig(**settings).num_standby_replicas == 1


def test_max_buffered_records_is_deprecated_and_still_honoured() -> None:
    assert StreamsConfig("a", "b", "c").max_buffered_records is None
    with pytest.warns(FutureWarning, match="max_buffered_bytes"):
        config = StreamsConfig(
            **streams_command.settings(parsed(*REQUIRED, "--max-buffered-records", "10"), {})
        )
    assert config.max_buffered_records == 10
    with pytest.raises(ValueError, match="max_buffered_records must be at least 1"):
        StreamsConfig("a", "b", "c", max_buffered_records=0)


async def test_sasl_ssl_reaches_every_kafka_client_the_app_makes() -> None:
    config = StreamsConfig(
        application_id="secured",
        bootstrap_servers="kafka-1.example:9093",
        coordinator_url="http://keyrange.example",
        kafka_security=KafkaSecurity(
            protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username="app",
            sasl_password=PASSWORD,
        ),
        consumer_options={"fetch_max_wait_ms": 100},
    )
    app = StreamsApp(streams_join.build_topology(), config)
    producer, restorer = app._connections()
    admin = app._admin()
    # aiokafka's own client under each: what it will connect with.
    clients = {"producer": producer.client, "restorer": restorer._client, "admin": admin._client}
    for name, client in clients.items():
        assert client._security_protocol == "SASL_SSL", name
        assert isinstance(client._ssl_context, ssl.SSLContext), name
        assert client._ssl_context.verify_mode is ssl.CERT_REQUIRED, name
        assert client._sasl_mechanism == "SCRAM-SHA-512", name
        assert (client._sasl_plain_username, client._sasl_plain_password) == ("app", PASSWORD)
    consumer = app._consumer._fetcher._kafka_kwargs
    assert consumer["security_protocol"] == "SASL_SSL"
    assert consumer["sasl_mechanism"] == "SCRAM-SHA-512"
    assert consumer["sasl_plain_username"] == "app"
    assert isinstance(consumer["ssl_context"], ssl.SSLContext)
    assert consumer["fetch_max_wait_ms"] == 100
    await producer.client.close()
    await admin.close()


async def test_explicit_plaintext_variables_run_end_to_end(
    kafka_bootstrap: str,
    coordinator_url: str,
    make_topic: MakeTopic,
    tmp_path: Path,
    spawned: list[StreamsProcess],
) -> None:
    lines, words, counts = await make_topic(1), await make_topic(1), await make_topic(1)
    env = {
        "WORDCOUNT_LINES": lines,
        "WORDCOUNT_WORDS": words,
        "WORDCOUNT_COUNTS": counts,
        "KEYRANGE_STREAMS_KAFKA_SECURITY_PROTOCOL": "PLAINTEXT",
    }
    await produce(kafka_bootstrap, lines, [(b"l0", b"to be or not to be", None)])
    process = await start_streams(
        "examples.streams_wordcount:build_topology",
        f"plain-{lines}",
        kafka_bootstrap,
        coordinator_url,
        tmp_path,
        env,
    )
    spawned.append(process)
    async with TopicReader(kafka_bootstrap, counts) as reader:

        async def counted() -> bool:
            await reader.poll()
            return reader.latest() == {"to": 2, "be": 2, "or": 1, "not": 1}

        await until(counted, 60, "the words counted")
    assert await process.stop(signal.SIGTERM) == 0


async def test_sasl_against_the_plaintext_broker_stops_at_start_with_exit_1(
    kafka_bootstrap: str, coordinator_url: str, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """The variables reach the connections of a real process: the embedded broker speaks
    PLAINTEXT only, so the SASL handshake fails and the application does not start."""
    lines = await make_topic(1)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "client.cli",
        "streams",
        "examples.streams_wordcount:build_topology",
        "--application-id",
        f"sasl-{lines}",
        "--bootstrap",
        kafka_bootstrap,
        "--coordinator",
        coordinator_url,
        "--state-dir",
        str(tmp_path),
        "--log-level",
        "CRITICAL",
        cwd=ROOT,
        env={
            **os.environ,
            "WORDCOUNT_LINES": lines,
            "KEYRANGE_STREAMS_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "KEYRANGE_STREAMS_KAFKA_SASL_MECHANISM": "PLAIN",
            "KEYRANGE_STREAMS_KAFKA_SASL_USERNAME": "app",
            "KEYRANGE_STREAMS_KAFKA_SASL_PASSWORD": PASSWORD,
        },
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(90):
        _, stderr = await process.communicate()
    lines_out = stderr.decode().strip().splitlines()
    assert process.returncode == 1
    assert len(lines_out) == 1 and lines_out[0].startswith("keyrange streams: "), lines_out
    assert PASSWORD not in lines_out[0], lines_out[0]
