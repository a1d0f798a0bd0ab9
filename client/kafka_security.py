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
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from aiokafka.abc import AbstractTokenProvider
from aiokafka.helpers import create_ssl_context

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]

_TLS_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})
_SASL_PROTOCOLS = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})


class TokenFile(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka ships no types
    """An OAUTHBEARER token read from a file at every connection, so a token the platform
    rotates (a projected service-account token, a sidecar's refreshed token) is used
    without restarting the coordinator."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def token(self) -> str:
        return (await asyncio.to_thread(Path(self.path).read_text)).strip()


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
                options["sasl_oauth_token_provider"] = TokenFile(self.sasl_oauth_token_file)
            else:
                assert self.sasl_password is not None  # problems() requires it
                # aiokafka takes SCRAM credentials under the PLAIN names too.
                options["sasl_plain_username"] = self.sasl_username
                options["sasl_plain_password"] = self.sasl_password
        return options
