"""Coordinator settings, read from ``KEYRANGE_*`` environment variables.

Every knob an operator can turn lives here so the README, the Helm chart and the code
agree on one list of names and defaults.
"""

from __future__ import annotations

from ipaddress import ip_address, ip_network
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError
from sqlalchemy.engine import make_url

from client.kafka_security import KafkaSecurity, SaslMechanism, SecurityProtocol

ENV_PREFIX = "KEYRANGE_"


class ClientToken(BaseModel):
    """A client-scope token, optionally limited to groups whose id starts with a prefix."""

    token: SecretStr
    group_prefixes: list[str] = Field(default_factory=list)

    def allows_group(self, group_id: str) -> bool:
        return not self.group_prefixes or any(group_id.startswith(p) for p in self.group_prefixes)


class Settings(BaseSettings):
    # Inputs are left out of error messages: they hold passwords and tokens.
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", hide_input_in_errors=True
    )

    database_url: SecretStr | None = Field(
        default=None,
        description="postgresql+asyncpg:// URL; unset starts an embedded Postgres under data_dir.",
    )
    kafka_bootstrap: str | None = Field(
        default=None, description="Kafka bootstrap servers; unset starts an embedded broker."
    )
    data_dir: str = Field(default=".keyrange", description="Where embedded services keep data.")
    # Kafka's own default port, so a command naming 127.0.0.1:9092 works from one start of the
    # embedded broker to the next.
    embedded_broker_port: int = Field(
        default=9092, ge=1, le=65535, description="Loopback port of the embedded broker."
    )
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=1, le=65535)
    migrate_on_start: bool = True
    log_level: str = "INFO"
    # "auto": text on a terminal, JSON otherwise (coordinator/logs.py).
    log_format: Literal["auto", "json", "text"] = "auto"

    admin_tokens: list[SecretStr] = Field(default_factory=list)
    client_tokens: list[ClientToken] = Field(default_factory=list)

    # A fixed pool: overflow connections are closed on return, and under steady load that
    # churns connections (measured: ~100 reconnects in 7 s at 64 concurrent committers).
    db_pool_size: int = Field(default=20, ge=1, le=200)
    db_max_overflow: int = Field(default=0, ge=0, le=200)
    db_statement_timeout_ms: int = Field(default=10_000, ge=100)

    # Concurrent commits share transactions (coordinator/offsets/batching.py): up to this many
    # requests per transaction, and this many transactions in flight, each on one pooled
    # connection.
    commit_batch_max_requests: int = Field(default=128, ge=1, le=10_000)
    commit_batch_workers: int = Field(default=4, ge=1, le=64)

    # Defaults of the KIP's switches; the live values are stored in the database and can be
    # flipped at run time through the admin API.
    accept_individual_commit: bool = True
    default_accept_range_fetch: bool = False

    # 60,000 is the KIP's figure: a 1 MB request holds at most that many 16-byte ranges.
    max_ranges_per_request: int = Field(default=60_000, ge=1)
    # A partition holding this many IC ranges almost always means a stuck or dead member.
    max_ic_ranges_per_partition: int = Field(default=10_000, ge=1)
    max_watermark_pieces_per_partition: int = Field(default=4_096, ge=1)
    max_metadata_chars: int = Field(default=4_096, ge=0)
    max_partitions_per_request: int = Field(default=10_000, ge=1)
    # Big enough for max_ranges_per_request ranges written as JSON pairs of int64s.
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)

    session_timeout_min_ms: int = Field(default=1_000, ge=100)
    session_timeout_max_ms: int = Field(default=300_000, ge=1_000)
    session_timeout_default_ms: int = Field(default=10_000, ge=100)
    heartbeat_interval_ms: int = Field(default=3_000, ge=50)
    # Hold the heartbeats of members with nothing to do until something changes for them
    # (docs/membership.md, "Prompt hand-offs"); off: every reply goes out at once.
    prompt_handoff: bool = True
    reaper_interval_ms: int = Field(default=1_000, ge=50)
    metadata_refresh_ms: int = Field(default=10_000, ge=100)
    default_assignor: str = "round-robin"

    # Mirror each group's stable offsets into the Kafka consumer group of the same name (with
    # this prefix), where kafka-consumer-groups, Burrow and KEDA's Kafka scaler read lag
    # (docs/operations.md, "Lag in Kafka's own tools"); once per metadata refresh.
    mirror_offsets: Literal["off", "all"] = "off"
    mirror_group_prefix: str = Field(default="", max_length=200)

    # The coordinator's own Kafka connection (docs/kafka-security.md); checked together by
    # ``_kafka_security_consistent``.
    kafka_security_protocol: SecurityProtocol = "PLAINTEXT"
    kafka_ssl_cafile: str | None = None
    kafka_ssl_certfile: str | None = None
    kafka_ssl_keyfile: str | None = None
    kafka_ssl_key_password: SecretStr | None = None
    kafka_ssl_check_hostname: bool = True
    kafka_sasl_mechanism: SaslMechanism | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_sasl_oauth_token_file: str | None = None

    # Per-tenant caps (docs/quotas.md): what one team's clients can make the coordinator store.
    # A tenant is a client token's group prefix; without prefixes, the whole coordinator.
    max_members_per_group: int = Field(default=1_000, ge=1)
    # As many as one commit may carry, so one commit can always cover a whole group.
    max_partitions_per_group: int = Field(default=10_000, ge=1)
    max_groups_per_prefix: int = Field(default=1_000, ge=1)
    # Kafka's offsets.retention.minutes (7 days): a group with no members and no commits for
    # this long is deleted with its offsets, checked as often as Kafka does (10 minutes).
    offsets_retention_minutes: int = Field(default=7 * 24 * 60, ge=1)
    offsets_retention_check_interval_ms: int = Field(default=600_000, ge=100)

    # Per-group series (group id, topic, lag) on /metrics: off unless opted in, or for
    # scrapers presenting one of these tokens (docs/quotas.md).
    metrics_group_labels: bool = False
    metrics_tokens: list[SecretStr] = Field(default_factory=list)

    # Slow and idle connections (coordinator/serving.py). A request's headers must arrive
    # within header_read_timeout_s of the connection opening (or of the request's first byte
    # on a kept-alive connection), and its body within body_read_timeout_s of the headers:
    # a 4 MiB commit at 30 s still leaves 140 KB/s. The keep-alive timeout is longer than
    # the SDK's pool keeps idle connections (httpx: 5 s), so the client, not the server,
    # closes them and never reuses one the server is closing.
    header_read_timeout_s: float = Field(default=10.0, gt=0, le=3_600)
    body_read_timeout_s: float = Field(default=30.0, gt=0, le=3_600)
    keep_alive_timeout_s: int = Field(default=15, ge=1, le=3_600)
    # Requests arriving while this many connections are open (or requests in progress) are
    # answered 503 by the HTTP server; slow connections are bounded by the read timeouts. A
    # stable member's heartbeat waits on an open connection (prompt hand-offs), so the bound
    # must exceed the members served by one replica, with room for commits besides.
    max_connections: int = Field(default=10_000, ge=1)

    # Hosts a member may advertise as its query endpoint (docs/security.md, "Queries over
    # HTTP"): host-name globs (``*.streams.svc.cluster.local``) or networks of literal
    # addresses (``10.0.0.0/8``). Empty: any host, as before the setting existed.
    allowed_endpoint_hosts: list[str] = Field(default_factory=list)

    @field_validator("database_url")
    @classmethod
    def _asyncpg_driver(cls, value: SecretStr | None) -> SecretStr | None:
        """Accept the plain URLs that operators' secrets hold (CloudNativePG's ``uri`` key,
        managed databases) by selecting the asyncpg driver the coordinator runs on."""
        if value is None:
            return None
        url = value.get_secret_value()
        for plain in ("postgresql://", "postgres://"):
            if url.startswith(plain):
                url = "postgresql+asyncpg://" + url[len(plain) :]
        if not url.startswith("postgresql+asyncpg://"):
            raise ValueError("database_url must be a postgresql:// or postgresql+asyncpg:// URL")
        try:
            make_url(url)
        except Exception:
            # The parser's own message may quote any part of the URL, the password included.
            raise ValueError(
                "database_url cannot be parsed; expected postgresql://user:password@host:port/"
                "database, with special characters in the password percent-encoded"
            ) from None
        return SecretStr(url)

    @field_validator("allowed_endpoint_hosts")
    @classmethod
    def _host_patterns(cls, value: list[str]) -> list[str]:
        patterns = [pattern.strip().lower() for pattern in value]
        if any(not pattern for pattern in patterns):
            raise ValueError("allowed_endpoint_hosts holds host globs or CIDRs, none empty")
        for pattern in patterns:
            if "/" in pattern:
                try:
                    ip_network(pattern, strict=False)
                except ValueError:
                    raise ValueError(f"allowed_endpoint_hosts: {pattern!r} is no CIDR") from None
        return patterns

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        upper = value.upper()
        if upper not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
            raise ValueError("log_level must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
        return upper

    @model_validator(mode="after")
    def _kafka_security_consistent(self) -> Settings:
        problems = self.kafka_security.problems()
        if self.kafka_bootstrap is None and self.kafka_security_protocol != "PLAINTEXT":
            problems.append(
                "kafka security settings need KEYRANGE_KAFKA_BOOTSTRAP: the embedded broker "
                "speaks PLAINTEXT only"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def kafka_security(self) -> KafkaSecurity:
        return KafkaSecurity(
            protocol=self.kafka_security_protocol,
            ssl_cafile=self.kafka_ssl_cafile,
            ssl_certfile=self.kafka_ssl_certfile,
            ssl_keyfile=self.kafka_ssl_keyfile,
            ssl_key_password=_revealed(self.kafka_ssl_key_password),
            ssl_check_hostname=self.kafka_ssl_check_hostname,
            sasl_mechanism=self.kafka_sasl_mechanism,
            sasl_username=self.kafka_sasl_username,
            sasl_password=_revealed(self.kafka_sasl_password),
            sasl_oauth_token_file=self.kafka_sasl_oauth_token_file,
        )

    @property
    def auth_enabled(self) -> bool:
        return bool(self.admin_tokens or self.client_tokens)

    def check_bind_address(self) -> None:
        """Refuse to expose an unauthenticated coordinator beyond this machine."""
        if self.auth_enabled:
            return
        if self.host == "localhost":
            return
        try:
            loopback = ip_address(self.host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(
                f"refusing to listen on {self.host} without API tokens: set KEYRANGE_ADMIN_TOKENS "
                "and/or KEYRANGE_CLIENT_TOKENS, or listen on 127.0.0.1"
            )


class InvalidSettings(Exception):
    """Settings the coordinator cannot start with. The message names each variable at fault
    and what is wrong with it, and never its value: a token or a database password in a
    malformed variable must not reach a terminal or a log collector."""


def _revealed(secret: SecretStr | None) -> str | None:
    return None if secret is None else secret.get_secret_value()


def load_settings(**overrides: object) -> Settings:
    """The settings from the environment (and ``overrides``), or ``InvalidSettings``.

    Pydantic's own error message quotes every rejected input, so it is never shown: each
    error is rebuilt from where it is and pydantic's description, which holds no input."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = [
            f"{_variable(error['loc'])}: {error['msg']}"
            for error in exc.errors(include_url=False, include_input=False, include_context=False)
        ]
        raise InvalidSettings("; ".join(problems)) from None
    except SettingsError as exc:
        raise InvalidSettings(str(exc)) from None


def _variable(location: tuple[int | str, ...]) -> str:
    """``KEYRANGE_CLIENT_TOKENS[0].group_prefixes`` for a location in the settings."""
    if not location:
        return "settings"
    head, *rest = location
    name = ENV_PREFIX + str(head).upper()
    return name + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in rest)
