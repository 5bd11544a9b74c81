"""Settings read once from environment variables into frozen objects.

A bad value fails at start with a message that names the variable. Each
service adds its own section (`services/<name>/config.py`) built with the same
helpers.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


class SettingsError(ValueError):
    """A configuration value is missing or malformed."""


Env = Mapping[str, str]


def env_str(env: Env, name: str, default: str) -> str:
    """A string variable (empty counts as unset)."""
    value = env.get(name, "")
    return value if value != "" else default


def env_int(
    env: Env, name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """An integer variable within optional bounds."""
    raw = env.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise SettingsError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise SettingsError(f"{name} must be at most {maximum}, got {value}")
    return value


def env_float(
    env: Env, name: str, default: float, *, minimum: float = 0.0, maximum: float | None = None
) -> float:
    """A float variable, at least `minimum` (and at most `maximum` when given)."""
    raw = env.get(name, "")
    if raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a number, got {raw!r}") from None
    if value != value or value < minimum:  # NaN compares unequal to itself
        raise SettingsError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise SettingsError(f"{name} must be at most {maximum}, got {value}")
    return value


def env_bool(env: Env, name: str, default: bool) -> bool:
    """A boolean variable: 1/true/yes/on or 0/false/no/off."""
    raw = env.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in {"1", "true", "yes", "on"}:
        return True
    if raw in {"0", "false", "no", "off"}:
        return False
    raise SettingsError(f"{name} must be a boolean (1/0, true/false), got {raw!r}")


def env_choice(env: Env, name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of a fixed set of strings."""
    value = env_str(env, name, default)
    if value not in choices:
        raise SettingsError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def env_address(env: Env, name: str, default: str) -> str:
    """A host:port address."""
    value = env_str(env, name, default)
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise SettingsError(f"{name} must be host:port, got {value!r}")
    return value


def is_loopback(address: str) -> bool:
    """True for a host:port on the loopback interface."""
    host = address.rpartition(":")[0].strip("[]")
    return host in {"127.0.0.1", "localhost", "::1"} or host.startswith("127.")


def default_listen(env: Env) -> str:
    """The listen address when RUNIFOLD_LISTEN is unset: loopback at PORT, else 50051."""
    port = env.get("PORT", "")
    return f"127.0.0.1:{port}" if port.isdigit() else "127.0.0.1:50051"


@dataclass(frozen=True)
class AdmissionLimits:
    """Per-namespace concurrency limits of the expensive calls (services/common/admission.py).

    Each is the most calls of that kind one namespace may have in flight in one
    process; 0 means no limit. The defaults keep a namespace well inside the
    shared capacity: 16 searches against an embedding queue of 256 texts, 8 turns
    against 64 concurrent model calls, 4 proposal runs against the proposer's own 64
    (each run is one model call, after one embedding batch of the entries it reads
    and an index search per entry).
    """

    searches: int = 16
    turns: int = 8
    summarizes: int = 8
    upserts: int = 16
    proposals: int = 4
    # RequestCuration calls (an enqueue each; the jobs' cost is the curation budget's).
    curations: int = 16
    # Turns of a namespace waiting for their lease (without their turn slot).
    waiting_turns: int = 32
    # The retry hint before any call of a kind has finished (then: their mean duration).
    retry_after_s: float = 1.0

    def limit(self, kind: str) -> int:
        """The limit of one kind of call: search, turn, summarize, upsert, propose or
        curate; turn_wait: the turns waiting for their lease."""
        return {
            "search": self.searches,
            "turn": self.turns,
            "summarize": self.summarizes,
            "upsert": self.upserts,
            "propose": self.proposals,
            "curate": self.curations,
            "turn_wait": self.waiting_turns,
        }[kind]

    @classmethod
    def from_env(cls, env: Env) -> AdmissionLimits:
        def limit(name: str, default: int) -> int:
            return env_int(env, name, default, minimum=0, maximum=1_000_000)

        return cls(
            searches=limit("RUNIFOLD_NAMESPACE_MAX_SEARCHES", 16),
            turns=limit("RUNIFOLD_NAMESPACE_MAX_TURNS", 8),
            summarizes=limit("RUNIFOLD_NAMESPACE_MAX_SUMMARIZE", 8),
            upserts=limit("RUNIFOLD_NAMESPACE_MAX_UPSERTS", 16),
            proposals=limit("RUNIFOLD_NAMESPACE_MAX_PROPOSALS", 4),
            curations=limit("RUNIFOLD_NAMESPACE_MAX_CURATION_REQUESTS", 16),
            waiting_turns=limit("RUNIFOLD_NAMESPACE_MAX_WAITING_TURNS", 32),
            retry_after_s=env_float(
                env, "RUNIFOLD_ADMISSION_RETRY_AFTER_S", 1.0, minimum=0.1, maximum=60.0
            ),
        )


@dataclass(frozen=True)
class TransportLimits:
    """What the gRPC server accepts before any of our code runs (services/common/server.py).

    `max_receive_message_bytes` None: just above the largest request the hosted
    services allow (each component reports its own; see `request_bytes_bound`).
    Durations are seconds; 0 turns a connection limit off.
    """

    max_receive_message_bytes: int | None = None
    max_send_message_bytes: int = 16 * 1024 * 1024
    max_concurrent_rpcs: int = 1024
    max_connections: int = 4096
    handshake_timeout_s: float = 10.0
    max_connection_idle_s: float = 300.0
    max_connection_age_s: float = 1800.0
    max_connection_age_grace_s: float = 300.0
    keepalive_time_s: float = 300.0
    keepalive_timeout_s: float = 20.0
    min_client_ping_interval_s: float = 10.0

    @classmethod
    def from_env(cls, env: Env) -> TransportLimits:
        raw_cap = env.get("RUNIFOLD_MAX_RECEIVE_MESSAGE_BYTES", "")
        return cls(
            max_receive_message_bytes=env_int(
                env,
                "RUNIFOLD_MAX_RECEIVE_MESSAGE_BYTES",
                0,
                minimum=1024 * 1024,
                maximum=256 * 1024 * 1024,
            )
            if raw_cap
            else None,
            max_send_message_bytes=env_int(
                env,
                "RUNIFOLD_MAX_SEND_MESSAGE_BYTES",
                16 * 1024 * 1024,
                minimum=1024 * 1024,
                maximum=256 * 1024 * 1024,
            ),
            max_concurrent_rpcs=env_int(
                env, "RUNIFOLD_MAX_CONCURRENT_RPCS", 1024, minimum=0, maximum=1_000_000
            ),
            max_connections=env_int(
                env, "RUNIFOLD_MAX_CONNECTIONS", 4096, minimum=0, maximum=1_000_000
            ),
            handshake_timeout_s=env_float(
                env, "RUNIFOLD_HANDSHAKE_TIMEOUT_S", 10.0, minimum=0.1, maximum=300.0
            ),
            max_connection_idle_s=env_float(
                env, "RUNIFOLD_MAX_CONNECTION_IDLE_S", 300.0, maximum=86_400.0
            ),
            max_connection_age_s=env_float(
                env, "RUNIFOLD_MAX_CONNECTION_AGE_S", 1800.0, maximum=30 * 86_400.0
            ),
            max_connection_age_grace_s=env_float(
                env, "RUNIFOLD_MAX_CONNECTION_AGE_GRACE_S", 300.0, maximum=86_400.0
            ),
            keepalive_time_s=env_float(
                env, "RUNIFOLD_KEEPALIVE_TIME_S", 300.0, minimum=1.0, maximum=86_400.0
            ),
            keepalive_timeout_s=env_float(
                env, "RUNIFOLD_KEEPALIVE_TIMEOUT_S", 20.0, minimum=1.0, maximum=3600.0
            ),
            min_client_ping_interval_s=env_float(
                env, "RUNIFOLD_MIN_CLIENT_PING_INTERVAL_S", 10.0, minimum=1.0, maximum=3600.0
            ),
        )


@dataclass(frozen=True)
class Settings:
    """What every server process needs, whichever services it hosts."""

    listen_address: str
    metrics_address: str | None
    database_url: str | None
    data_dir: Path
    db_pool_min: int
    db_pool_max: int
    db_timeout_s: float
    db_statement_timeout_ms: int
    migrate: str
    page_token_secret: bytes
    health_interval_s: float
    shutdown_grace_s: float
    transport: TransportLimits
    admission: AdmissionLimits
    log_level: str
    log_format: str
    slow_rpc_s: float
    transcript_service_addr: str | None
    summary_service_addr: str | None
    memory_service_addr: str | None

    @classmethod
    def from_env(cls, env: Env | None = None) -> Settings:
        """Read every variable once; raise SettingsError naming a bad one."""
        env = os.environ if env is None else env
        metrics = env_str(env, "RUNIFOLD_METRICS_LISTEN", "127.0.0.1:9464")
        secret = env.get("RUNIFOLD_PAGE_TOKEN_SECRET", "")
        if secret and len(secret) < 16:
            raise SettingsError("RUNIFOLD_PAGE_TOKEN_SECRET must be at least 16 characters")
        listen = env_address(env, "RUNIFOLD_LISTEN", default_listen(env))
        if not secret and not is_loopback(listen):
            # A secret made up per process would make every page token of one replica
            # invalid on the next: fail closed, as for authentication.
            raise SettingsError(
                f"RUNIFOLD_PAGE_TOKEN_SECRET must be set when listening on {listen}: every "
                "replica signs and checks page tokens with it (at least 16 characters, the "
                "same on every replica)"
            )
        return cls(
            listen_address=listen,
            metrics_address=None
            if metrics == "off"
            else env_address(env, "RUNIFOLD_METRICS_LISTEN", "127.0.0.1:9464"),
            database_url=env.get("DATABASE_URL") or None,
            data_dir=Path(env_str(env, "RUNIFOLD_DATA_DIR", ".runifold")),
            db_pool_min=env_int(env, "RUNIFOLD_DB_POOL_MIN", 2, minimum=0, maximum=1000),
            db_pool_max=env_int(env, "RUNIFOLD_DB_POOL_MAX", 16, minimum=1, maximum=1000),
            db_timeout_s=env_float(env, "RUNIFOLD_DB_TIMEOUT_S", 5.0, minimum=0.1),
            db_statement_timeout_ms=env_int(
                env, "RUNIFOLD_DB_STATEMENT_TIMEOUT_MS", 10_000, minimum=0
            ),
            migrate=env_choice(env, "RUNIFOLD_MIGRATE", "auto", ("auto", "check")),
            # Loopback only (one process, development): a secret of its own is enough.
            page_token_secret=secret.encode() if secret else secrets.token_bytes(32),
            health_interval_s=env_float(env, "RUNIFOLD_HEALTH_INTERVAL_S", 1.0, minimum=0.05),
            shutdown_grace_s=env_float(env, "RUNIFOLD_SHUTDOWN_GRACE_S", 10.0),
            transport=TransportLimits.from_env(env),
            admission=AdmissionLimits.from_env(env),
            log_level=env_choice(
                env, "RUNIFOLD_LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR")
            ),
            # auto: readable lines at a terminal (`make run`), JSON everywhere else.
            log_format=env_choice(env, "RUNIFOLD_LOG_FORMAT", "auto", ("auto", "json", "text")),
            # An RPC that took longer is logged at WARNING (the others at DEBUG).
            slow_rpc_s=env_float(env, "RUNIFOLD_SLOW_RPC_S", 5.0, minimum=0.0),
            transcript_service_addr=env.get("TRANSCRIPT_SERVICE_ADDR") or None,
            summary_service_addr=env.get("SUMMARY_SERVICE_ADDR") or None,
            memory_service_addr=env.get("MEMORY_SERVICE_ADDR") or None,
        )
