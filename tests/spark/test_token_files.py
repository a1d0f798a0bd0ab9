"""Spark options read no arbitrary files (issue 46, item 9): a ``file://`` OAUTHBEARER token
URL given as a data-source option is read only under the directories the reading process's
``KEYRANGE_KAFKA_OAUTH_TOKEN_DIRS`` names (none by default), as Kafka 4 fixed CVE-2025-27817
with an allow-list; otherwise any executor-local file would be sent as a bearer token to
bootstrap servers the options name. Pure: no Spark, no broker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from client.kafka_security import OAUTH_TOKEN_DIRS_ENV, KafkaPropertyError
from client.spark.kafka_settings import parse_kafka_settings
from client.spark.options import OptionError, parse_source_options

SPARK = {"kafka.bootstrap.servers": "k:9092", "subscribe": "orders"}


def oauth(url: str) -> dict[str, str]:
    return {
        **SPARK,
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "OAUTHBEARER",
        "kafka.sasl.jaas.config": (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
        ),
        "kafka.sasl.oauthbearer.token.endpoint.url": url,
    }


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    directory = tmp_path / "tokens"
    directory.mkdir()
    (directory / "token").write_text("the-token\n")
    (tmp_path / "secret").write_text("not a token")
    return directory


def test_no_token_file_is_read_unless_a_directory_is_allowed(
    tokens: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The base code read any path (``file:///etc/passwd`` included) and sent it as the
    token."""
    monkeypatch.delenv(OAUTH_TOKEN_DIRS_ENV, raising=False)
    for url in ("file:///etc/passwd", f"file://{tokens / 'token'}"):
        with pytest.raises(OptionError) as refused:
            parse_source_options(oauth(url))
        message = str(refused.value)
        assert "kafka.sasl.oauthbearer.token.endpoint.url" in message
        assert f"{OAUTH_TOKEN_DIRS_ENV} allows (it is not set)" in message


def test_a_token_under_an_allowed_directory_is_read_and_nothing_beside_it(
    tokens: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OAUTH_TOKEN_DIRS_ENV, f"/nonexistent, {tokens}")
    options = parse_source_options(oauth(f"file://{tokens / 'token'}"))
    assert options.kafka.security.sasl_oauth_token_file == str(tokens / "token")
    assert parse_source_options(oauth(f"file://localhost{tokens / 'token'}")).kafka.security
    (tokens / "link").symlink_to(tokens.parent / "secret")
    for outside in (
        tokens.parent / "secret",
        f"{tokens}/../secret",
        tokens / "link",
        "/etc/passwd",
    ):
        with pytest.raises(OptionError, match=f"not under a directory {OAUTH_TOKEN_DIRS_ENV}"):
            parse_source_options(oauth(f"file://{outside}"))


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("file://fileserver/etc/token", "names host 'fileserver'"),
        ("file:token", "must name an absolute path"),
        ("https://idp.example/token", "set sasl.oauthbearer.token.endpoint.url to a file:// URL"),
    ],
)
def test_a_token_url_on_another_host_or_relative_is_refused(
    url: str, message: str, tokens: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``file://host/path`` was read as the relative path ``host/path``."""
    monkeypatch.setenv(OAUTH_TOKEN_DIRS_ENV, "/")
    with pytest.raises(OptionError, match=message):
        parse_source_options(oauth(url))


async def test_the_executor_reading_the_token_checks_its_own_allow_list(
    tokens: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The options are parsed on the driver and the file read on an executor: the executor
    checks its own environment, so a driver allowing more does not open its files."""
    monkeypatch.setenv(OAUTH_TOKEN_DIRS_ENV, str(tokens))
    settings = parse_kafka_settings(oauth(f"file://{tokens / 'token'}"), "consumer")
    provider = settings.client_arguments()["sasl_oauth_token_provider"]
    assert await provider.token() == "the-token"
    monkeypatch.setenv(OAUTH_TOKEN_DIRS_ENV, os.fspath(tokens.parent / "elsewhere"))
    with pytest.raises(KafkaPropertyError, match=OAUTH_TOKEN_DIRS_ENV):
        await provider.token()
