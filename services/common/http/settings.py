"""Configuration of the HTTP port (RUNIFOLD_HTTP_*, RUNIFOLD_CONSOLE*), read once."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from services.common.settings import (
    Env,
    SettingsError,
    env_address,
    env_bool,
    env_str,
)

# Where the all-in-one server (`make run`) serves HTTP and the console unless told
# otherwise; a service process alone serves no HTTP unless RUNIFOLD_HTTP_LISTEN is set.
ALL_IN_ONE_DEFAULT = "127.0.0.1:8080"
_ORIGIN = re.compile(
    r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?|https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?"
)


@dataclass(frozen=True)
class HttpSettings:
    """The HTTP port: the services over Connect, gRPC-Web and JSON, and the console.

    `listen_address` None: no HTTP port. `cors_origins` empty: no CORS headers at all
    (a browser page of another origin cannot call the API); "*" allows any origin.
    `console`: serve the web console at `/`; `console_actions`: the console offers its
    write actions (erase a conversation, forget a memory's source, request a summary),
    each behind a confirmation. Read-only otherwise (the API itself is not: what a caller
    may do is what its identity grants, on every transport).
    """

    listen_address: str | None = None
    cors_origins: tuple[str, ...] = ()
    console: bool = False
    console_actions: bool = False

    @property
    def enabled(self) -> bool:
        return self.listen_address is not None

    @classmethod
    def from_env(cls, env: Env | None = None, *, all_in_one: bool = False) -> HttpSettings:
        """Read the variables; raise SettingsError naming a bad one."""
        env = os.environ if env is None else env
        default = ALL_IN_ONE_DEFAULT if all_in_one else "off"
        raw = env_str(env, "RUNIFOLD_HTTP_LISTEN", default)
        listen = None if raw == "off" else env_address(env, "RUNIFOLD_HTTP_LISTEN", default)
        return cls(
            listen_address=listen,
            cors_origins=_origins(env.get("RUNIFOLD_HTTP_CORS_ORIGINS", "")),
            console=env_bool(env, "RUNIFOLD_CONSOLE", all_in_one),
            console_actions=env_bool(env, "RUNIFOLD_CONSOLE_ACTIONS", False),
        )


def _origins(raw: str) -> tuple[str, ...]:
    """The allowed origins: "*", or a comma-separated list of scheme://host[:port]."""
    origins = tuple(part.strip() for part in raw.split(",") if part.strip())
    if origins == ("*",):
        return origins
    for origin in origins:
        if not _ORIGIN.fullmatch(origin):
            raise SettingsError(
                "RUNIFOLD_HTTP_CORS_ORIGINS must be * or a comma-separated list of origins "
                f"such as https://console.example.com (scheme, host, port; no path), got {origin!r}"
            )
    return origins
