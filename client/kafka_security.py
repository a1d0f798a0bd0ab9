"""How Keyrange's processes authenticate to Kafka and encrypt their connections
(docs/kafka-security.md): the coordinator's ``KEYRANGE_KAFKA_*`` settings and the worker's
``KEYRANGE_WORKER_KAFKA_*`` options become aiokafka's client options here, and nowhere else.

Combinations aiokafka would only refuse at the first connection (SASL without a mechanism,
TLS files that do not exist or do not load) are found when the settings are read, so a
misconfigured process stops at start with one message naming every problem instead of
logging connection errors for ever. It lives in the client because workers need it and may
not depend on the server's packages.
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, get_args
from urllib.parse import unquote, urlsplit

from aiokafka.abc import AbstractTokenProvider
from aiokafka.helpers import create_ssl_context

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]

_TLS_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})
_SASL_PROTOCOLS = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})


# Directories (comma-separated, as Kafka's ``org.apache.kafka.sasl.oauthbearer.allowed.urls``
# lists URLs) under which a ``file://`` token URL given as a Kafka property may name a file.
# Read from the environment of the process that reads the token, never from the properties:
# those may come from a less trusted party (a Spark job's data-source options on a shared SQL
# endpoint), who could otherwise have any local file sent as a bearer token to servers of
# their choosing (CVE-2025-27817). Unset or empty: no file is allowed.
OAUTH_TOKEN_DIRS_ENV = "KEYRANGE_KAFKA_OAUTH_TOKEN_DIRS"


class TokenFile(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka ships no types
    """An OAUTHBEARER token read from a file at every connection, so a token the platform
    rotates (a projected service-account token, a sidecar's refreshed token) is used
    without restarting the coordinator. ``confined``: the path came from Kafka properties,
    so it is checked against ``OAUTH_TOKEN_DIRS_ENV`` here too, where the file is read (a
    Spark executor), not only where the properties were parsed."""

    def __init__(self, path: str, *, confined: bool = False) -> None:
        self.path = path
        self.confined = confined

    async def token(self) -> str:
        if self.confined:
            allowed_token_file(self.path)
        return (await asyncio.to_thread(Path(self.path).read_text)).strip()


def token_file_of_url(url: str) -> str:
    """The local file a ``sasl.oauthbearer.token.endpoint.url`` names, once
    ``allowed_token_file`` admits it: a ``file://`` URL of an absolute path, on no host but
    this one."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "file":
        raise KafkaPropertyError(
            "OAUTHBEARER reads its token from a file here: set "
            "sasl.oauthbearer.token.endpoint.url to a file:// URL"
        )
    if parts.netloc not in ("", "localhost"):
        raise KafkaPropertyError(
            f"sasl.oauthbearer.token.endpoint.url names host {parts.netloc!r}: a token file "
            "is read on this machine only (file:///path)"
        )
    path = unquote(parts.path)
    if not path.startswith("/") or parts.query or parts.fragment:
        raise KafkaPropertyError(
            "sasl.oauthbearer.token.endpoint.url must name an absolute path (file:///path)"
        )
    return allowed_token_file(path)


def allowed_token_file(path: str, environ: Mapping[str, str] | None = None) -> str:
    """``path`` when, symbolic links and ``..`` resolved, it lies under a directory
    ``OAUTH_TOKEN_DIRS_ENV`` names; ``KafkaPropertyError`` naming the setting otherwise."""
    listed = (os.environ if environ is None else environ).get(OAUTH_TOKEN_DIRS_ENV, "")
    allowed = [Path(entry.strip()) for entry in listed.split(",") if entry.strip()]
    real = Path(os.path.realpath(path))
    if not any(
        directory.is_absolute() and real.is_relative_to(os.path.realpath(directory))
        for directory in allowed
    ):
        named = f"it names {listed!r}" if allowed else "it is not set"
        raise KafkaPropertyError(
            f"sasl.oauthbearer.token.endpoint.url: {path!r} is not under a directory "
            f"{OAUTH_TOKEN_DIRS_ENV} allows ({named}); a token file given as a Kafka property "
            f"is read only under the directories {OAUTH_TOKEN_DIRS_ENV} names in the "
            "environment of the process reading it (docs/kafka-security.md)"
        )
    return path


@dataclass(frozen=True)
class KafkaSecurity:
    """The security part of a Kafka connection. The secrets stay out of ``repr``, so a
    settings object that holds one can be logged."""

    protocol: SecurityProtocol = "PLAINTEXT"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_key_password: str | None = field(default=None, repr=False)
    ssl_check_hostname: bool = True
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    sasl_oauth_token_file: str | None = None
    # The token file came from Kafka properties: read only under OAUTH_TOKEN_DIRS_ENV.
    sasl_oauth_token_confined: bool = False

    @property
    def uses_tls(self) -> bool:
        return self.protocol in _TLS_PROTOCOLS

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in _SASL_PROTOCOLS

    def problems(self) -> list[str]:
        """Everything wrong with this combination, for one settings error; empty when none."""
        if self.protocol not in get_args(SecurityProtocol):
            return [
                f"kafka_security_protocol {self.protocol!r} is not one of "
                + ", ".join(get_args(SecurityProtocol))
            ]
        if self.sasl_mechanism is not None and self.sasl_mechanism not in get_args(SaslMechanism):
            return [
                f"kafka_sasl_mechanism {self.sasl_mechanism!r} is not one of "
                + ", ".join(get_args(SaslMechanism))
            ]
        return [*self._tls_problems(), *self._sasl_problems()]

    def _tls_problems(self) -> list[str]:
        files = {
            "kafka_ssl_cafile": self.ssl_cafile,
            "kafka_ssl_certfile": self.ssl_certfile,
            "kafka_ssl_keyfile": self.ssl_keyfile,
        }
        named = [name for name, path in files.items() if path is not None]
        if not self.uses_tls:
            return [
                f"{name} is set but kafka_security_protocol {self.protocol} does not use TLS "
                "(use SSL or SASL_SSL)"
                for name in named
            ]
        problems = [
            f"{name} {path!r} is not a readable file"
            for name, path in files.items()
            if path is not None and not Path(path).is_file()
        ]
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            problems.append(
                "kafka_ssl_certfile and kafka_ssl_keyfile go together (a client certificate "
                "needs its private key)"
            )
        if not problems:
            try:
                self.ssl_context()
            except (ssl.SSLError, OSError) as exc:
                problems.append(f"the TLS files do not load: {exc.strerror or exc}")
        return problems

    def _sasl_problems(self) -> list[str]:
        if not self.uses_sasl:
            set_anyway = [
                name
                for name, value in (
                    ("kafka_sasl_mechanism", self.sasl_mechanism),
                    ("kafka_sasl_username", self.sasl_username),
                    ("kafka_sasl_password", self.sasl_password),
                    ("kafka_sasl_oauth_token_file", self.sasl_oauth_token_file),
                )
                if value is not None
            ]
            return [
                f"{name} is set but kafka_security_protocol {self.protocol} does not use SASL "
                "(use SASL_PLAINTEXT or SASL_SSL)"
                for name in set_anyway
            ]
        if self.sasl_mechanism is None:
            return [
                f"kafka_security_protocol {self.protocol} needs kafka_sasl_mechanism "
                "(PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER)"
            ]
        if self.sasl_mechanism == "OAUTHBEARER":
            if self.sasl_oauth_token_file is None:
                return ["kafka_sasl_mechanism OAUTHBEARER needs kafka_sasl_oauth_token_file"]
            if not Path(self.sasl_oauth_token_file).is_file():
                return [
                    f"kafka_sasl_oauth_token_file {self.sasl_oauth_token_file!r} is not a "
                    "readable file"
                ]
            return []
        if self.sasl_username is None or self.sasl_password is None:
            return [
                f"kafka_sasl_mechanism {self.sasl_mechanism} needs kafka_sasl_username and "
                "kafka_sasl_password"
            ]
        return []

    def ssl_context(self) -> ssl.SSLContext:
        """A verifying client context: the system's CAs unless a CA file is given."""
        context: ssl.SSLContext = create_ssl_context(
            cafile=self.ssl_cafile,
            certfile=self.ssl_certfile,
            keyfile=self.ssl_keyfile,
            password=self.ssl_key_password,
        )
        context.check_hostname = self.ssl_check_hostname
        return context

    def aiokafka_options(self) -> dict[str, Any]:
        """Keyword arguments for aiokafka's clients; they hold the secrets in clear, so they
        are passed on and never logged."""
        options: dict[str, Any] = {"security_protocol": self.protocol}
        if self.uses_tls:
            options["ssl_context"] = self.ssl_context()
        if self.uses_sasl and self.sasl_mechanism is not None:
            options["sasl_mechanism"] = self.sasl_mechanism
            if self.sasl_mechanism == "OAUTHBEARER":
                assert self.sasl_oauth_token_file is not None  # problems() requires it
                options["sasl_oauth_token_provider"] = TokenFile(
                    self.sasl_oauth_token_file, confined=self.sasl_oauth_token_confined
                )
            else:
                assert self.sasl_password is not None  # problems() requires it
                # aiokafka takes SCRAM credentials under the PLAIN names too.
                options["sasl_plain_username"] = self.sasl_username
                options["sasl_plain_password"] = self.sasl_password
        return options


class KafkaPropertyError(ValueError):
    """A Kafka client property (Java client name) this security model cannot honour."""


_PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
_OAUTH_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
_JAAS_FLAGS = frozenset({"required", "requisite", "sufficient", "optional"})
_JAAS_OPTION = re.compile(r'\s*([A-Za-z0-9_.-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s";]+)')
# Kafka's security properties this model understands; the rest of a Java client's
# properties are the caller's business.
KAFKA_SECURITY_PROPERTIES = (
    "security.protocol",
    "sasl.mechanism",
    "sasl.jaas.config",
    "sasl.oauthbearer.token.endpoint.url",
    "ssl.truststore.location",
    "ssl.truststore.type",
    "ssl.keystore.location",
    "ssl.keystore.type",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
)
# Names of this model's problems() messages, as the Java client's properties say them.
KAFKA_PROPERTY_NAMES = {
    "kafka_security_protocol": "security.protocol",
    "kafka_sasl_mechanism": "sasl.mechanism",
    "kafka_sasl_username": "sasl.jaas.config username",
    "kafka_sasl_password": "sasl.jaas.config password",
    "kafka_sasl_oauth_token_file": "sasl.oauthbearer.token.endpoint.url (file://)",
    "kafka_ssl_cafile": "ssl.truststore.location",
    "kafka_ssl_certfile": "ssl.keystore.location",
    "kafka_ssl_keyfile": "ssl.keystore.location",
}


def parse_jaas_config(text: str) -> tuple[str, dict[str, str]]:
    """The login module and options of a one-module ``sasl.jaas.config`` value.

    Kafka's form: ``<LoginModule> <flag> key="value" key2=value2;`` with one module per
    client (Kafka itself refuses more).
    """
    body = text.strip().rstrip(";").strip()
    parts = body.split(None, 2)
    if len(parts) < 2 or parts[1] not in _JAAS_FLAGS:
        raise KafkaPropertyError(
            "sasl.jaas.config must read '<LoginModule> required key=\"value\" ...;'"
        )
    options: dict[str, str] = {}
    rest = parts[2] if len(parts) == 3 else ""
    position = 0
    while position < len(rest):
        match = _JAAS_OPTION.match(rest, position)
        if match is None:
            if rest[position:].strip():
                raise KafkaPropertyError(
                    f"sasl.jaas.config: cannot read the options from {rest[position:]!r}"
                )
            break
        value = match.group(2)
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        options[match.group(1)] = value
        position = match.end()
    return parts[0], options


def security_from_kafka_properties(properties: Mapping[str, str]) -> KafkaSecurity:
    """``KafkaSecurity`` from a Java Kafka client's properties (``security.protocol``,
    ``sasl.jaas.config``, PEM trust and key stores, ...), so a job configured the Kafka way
    runs on the same model as the coordinator and the workers.

    Raises ``KafkaPropertyError`` for what Python's clients cannot do (JKS/PKCS12 stores,
    Kerberos, OAuth client credentials); ``problems()`` still judges the combination.
    """
    jaas_module: str | None = None
    jaas: dict[str, str] = {}
    if "sasl.jaas.config" in properties:
        jaas_module, jaas = parse_jaas_config(properties["sasl.jaas.config"])
    mechanism = properties.get("sasl.mechanism")
    username = password = token_file = None
    if jaas_module in (_PLAIN_MODULE, _SCRAM_MODULE):
        expected = "PLAIN" if jaas_module == _PLAIN_MODULE else "SCRAM-SHA-"
        if mechanism is not None and not mechanism.startswith(expected):
            raise KafkaPropertyError(
                f"sasl.jaas.config uses {jaas_module.rsplit('.', 1)[-1]}, which does not "
                f"serve sasl.mechanism {mechanism}"
            )
        username, password = jaas.get("username"), jaas.get("password")
    elif jaas_module == _OAUTH_MODULE:
        token_file = token_file_of_url(properties.get("sasl.oauthbearer.token.endpoint.url", ""))
    elif jaas_module is not None:
        raise KafkaPropertyError(
            f"sasl.jaas.config login module {jaas_module} is not supported: PlainLoginModule, "
            "ScramLoginModule and OAuthBearerLoginModule are"
        )
    cafile = _pem_store(properties, "truststore")
    keystore = _pem_store(properties, "keystore")
    algorithm = properties.get("ssl.endpoint.identification.algorithm", "https")
    return KafkaSecurity(
        protocol=cast(SecurityProtocol, properties.get("security.protocol", "PLAINTEXT")),
        ssl_cafile=cafile,
        # A PEM key store holds the private key and the certificate chain in one file.
        ssl_certfile=keystore,
        ssl_keyfile=keystore,
        ssl_key_password=properties.get("ssl.key.password"),
        ssl_check_hostname=algorithm.strip().lower() == "https",
        sasl_mechanism=cast(SaslMechanism | None, mechanism),
        sasl_username=username,
        sasl_password=password,
        sasl_oauth_token_file=token_file,
        sasl_oauth_token_confined=token_file is not None,
    )


def _pem_store(properties: Mapping[str, str], store: str) -> str | None:
    location = properties.get(f"ssl.{store}.location")
    if location is None:
        return None
    kind = properties.get(f"ssl.{store}.type", "JKS").upper()
    if kind != "PEM":
        raise KafkaPropertyError(
            f"ssl.{store}.type {kind}: Python's TLS reads PEM files only; convert the store "
            f"(keytool -importkeystore, openssl pkcs12) and set ssl.{store}.type=PEM"
        )
    return location
