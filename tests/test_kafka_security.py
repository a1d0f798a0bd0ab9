"""The ``KEYRANGE_KAFKA_*`` security settings, mapped onto aiokafka's client options.

The embedded broker has no TLS or SASL listener, so these tests hold the mapping to what
aiokafka's own client accepts, and every bad combination to a settings error that names it;
docs/kafka-security.md describes the manual check against a real cluster.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Any

import pytest
from aiokafka.client import AIOKafkaClient
from pydantic import ValidationError

from coordinator.kafka import ClusterMetadata
from coordinator.settings import Settings

PASSWORD = "pa55-never-printed"
BOOTSTRAP = "kafka-1.example:9093"


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA, and a client certificate with its key, made by the openssl command."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make certificates")
    folder = tmp_path_factory.mktemp("tls")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
        "-keyout", "ca.key", "-out", "ca.pem",
    )  # fmt: skip
    openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=keyrange",
        "-keyout", "client.key", "-out", "client.csr",
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "2", "-out", "client.pem",
    )  # fmt: skip
    return {name: str(folder / name) for name in ("ca.pem", "client.pem", "client.key")}


def settings(**values: Any) -> Settings:
    return Settings(kafka_bootstrap=BOOTSTRAP, **values)


def test_plaintext_is_the_default_and_adds_nothing() -> None:
    assert settings().kafka_security.aiokafka_options() == {"security_protocol": "PLAINTEXT"}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_sasl_ssl_with_a_password_mechanism_is_what_aiokafka_takes(
    tls_files: dict[str, str], mechanism: str
) -> None:
    options = settings(
        kafka_security_protocol="SASL_SSL",
        kafka_ssl_cafile=tls_files["ca.pem"],
        kafka_ssl_certfile=tls_files["client.pem"],
        kafka_ssl_keyfile=tls_files["client.key"],
        kafka_sasl_mechanism=mechanism,
        kafka_sasl_username="keyrange",
        kafka_sasl_password=PASSWORD,
    ).kafka_security.aiokafka_options()
    context = options.pop("ssl_context")
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    assert [cert["subject"] for cert in context.get_ca_certs()] == [((("commonName", "test-ca"),),)]
    assert options == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "keyrange",
        "sasl_plain_password": PASSWORD,
    }
    # aiokafka's client checks its options when it is made; no connection is opened here.
    AIOKafkaClient(bootstrap_servers=BOOTSTRAP, ssl_context=context, **options)


def test_ssl_without_a_ca_file_verifies_against_the_system_cas() -> None:
    options = settings(
        kafka_security_protocol="SSL", kafka_ssl_check_hostname=False
    ).kafka_security.aiokafka_options()
    assert options["security_protocol"] == "SSL"
    assert options["ssl_context"].verify_mode is ssl.CERT_REQUIRED
    assert not options["ssl_context"].check_hostname
    assert "sasl_mechanism" not in options


async def test_oauthbearer_reads_its_token_file_at_each_connection(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("first-token\n")
    options = settings(
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="OAUTHBEARER",
        kafka_sasl_oauth_token_file=str(token_file),
    ).kafka_security.aiokafka_options()
    provider = options["sasl_oauth_token_provider"]
    assert await provider.token() == "first-token"
    token_file.write_text("rotated-token")
    assert await provider.token() == "rotated-token"
    AIOKafkaClient(bootstrap_servers=BOOTSTRAP, **options)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"kafka_security_protocol": "SASL_SSL"}, "needs kafka_sasl_mechanism"),
        (
            {"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_mechanism": "SCRAM-SHA-512"},
            "needs kafka_sasl_username and kafka_sasl_password",
        ),
        (
            {
                "kafka_security_protocol": "SASL_PLAINTEXT",
                "kafka_sasl_mechanism": "PLAIN",
                "kafka_sasl_username": "keyrange",
            },
            "needs kafka_sasl_username and kafka_sasl_password",
        ),
        (
            {"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "OAUTHBEARER"},
            "OAUTHBEARER needs kafka_sasl_oauth_token_file",
        ),
        (
            {"kafka_security_protocol": "SSL", "kafka_ssl_cafile": "/nonexistent/ca.pem"},
            "kafka_ssl_cafile '/nonexistent/ca.pem' is not a readable file",
        ),
        (
            {"kafka_ssl_cafile": "/nonexistent/ca.pem"},
            "kafka_ssl_cafile is set but kafka_security_protocol PLAINTEXT does not use TLS",
        ),
        (
            {"kafka_sasl_mechanism": "PLAIN", "kafka_sasl_password": PASSWORD},
            "kafka_sasl_mechanism is set but kafka_security_protocol PLAINTEXT does not use SASL",
        ),
        ({"kafka_security_protocol": "KERBEROS"}, "kafka_security_protocol"),
        ({"kafka_sasl_mechanism": "GSSAPI"}, "kafka_sasl_mechanism"),
    ],
)
def test_a_bad_combination_is_a_settings_error_naming_it(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError) as raised:
        settings(**values)
    assert message in str(raised.value)


def test_a_certificate_needs_its_key_and_files_must_load(
    tls_files: dict[str, str], tmp_path: Path
) -> None:
    with pytest.raises(ValidationError, match="kafka_ssl_certfile and kafka_ssl_keyfile go"):
        settings(kafka_security_protocol="SSL", kafka_ssl_certfile=tls_files["client.pem"])
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(ValidationError, match="the TLS files do not load"):
        settings(kafka_security_protocol="SSL", kafka_ssl_cafile=str(garbage))


def test_security_without_a_bootstrap_is_refused_since_the_embedded_broker_is_plaintext(
    tls_files: dict[str, str],
) -> None:
    with pytest.raises(ValidationError, match="need KEYRANGE_KAFKA_BOOTSTRAP"):
        Settings(kafka_security_protocol="SSL", kafka_ssl_cafile=tls_files["ca.pem"])


def test_passwords_are_never_printed(tls_files: dict[str, str]) -> None:
    good = settings(
        kafka_security_protocol="SASL_SSL",
        kafka_ssl_cafile=tls_files["ca.pem"],
        kafka_sasl_mechanism="SCRAM-SHA-256",
        kafka_sasl_username="keyrange",
        kafka_sasl_password=PASSWORD,
        kafka_ssl_key_password=PASSWORD,
    )
    assert PASSWORD not in repr(good) and PASSWORD not in str(good.kafka_security)
    with pytest.raises(ValidationError) as raised:
        settings(
            kafka_security_protocol="SASL_SSL",
            kafka_ssl_cafile="/nonexistent/ca.pem",
            kafka_sasl_mechanism="SCRAM-SHA-256",
            kafka_sasl_username="keyrange",
            kafka_sasl_password=PASSWORD,
        )
    assert "kafka_ssl_cafile" in str(raised.value)
    assert PASSWORD not in str(raised.value)


@pytest.mark.kafka
async def test_explicit_plaintext_settings_reach_the_embedded_broker(
    kafka_bootstrap: str,
) -> None:
    security = Settings(
        kafka_bootstrap=kafka_bootstrap, kafka_security_protocol="PLAINTEXT"
    ).kafka_security
    async with ClusterMetadata(kafka_bootstrap, security=security) as cluster:
        assert isinstance(await cluster.list_topics(), set)
