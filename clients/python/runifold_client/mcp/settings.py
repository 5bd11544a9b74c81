"""What `runifold mcp` is configured with: the Runifold server it calls, whose credentials,
and where it listens (read once from the environment and the command's options)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from runifold_client.client import DEFAULT_TARGET


class SettingsError(ValueError):
    """A setting that cannot work; the message names the variable or option."""


def is_loopback(host: str) -> bool:
    """True for a host on the loopback interface (as the services decide it)."""
    host = host.strip("[]")
    return host in {"127.0.0.1", "localhost", "::1"} or host.startswith("127.")


@dataclass(frozen=True)
class McpSettings:
    """`transport` stdio (one local client: its credentials are the process's,
    RUNIFOLD_TOKEN) or http (Streamable HTTP at `host`:`port`, path /mcp).

    `auth` "bearer" (HTTP only): every HTTP request carries `Authorization: Bearer
    <token>`, the token Runifold is called with; a request without one is refused
    (401). "none": the process's own RUNIFOLD_TOKEN (or none) serves every caller, so
    it listens on loopback only unless RUNIFOLD_ALLOW_INSECURE=1, as the services do.

    `namespace` (RUNIFOLD_NAMESPACE) is the operator's choice, never a tool argument:
    empty, Runifold takes the one namespace the caller's token grants.
    """

    target: str = DEFAULT_TARGET
    token: str = ""
    namespace: str = ""
    transport: str = "stdio"
    host: str = "127.0.0.1"
    port: int = 8765
    auth: str = "none"
    allow_insecure: bool = False
    timeout_s: float = 30.0
    # The most conversations a listen stream may follow (each is one WatchConversation;
    # RUNIFOLD_MCP_MAX_WATCHED).
    max_watched: int = 16

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **options: object) -> McpSettings:
        """The settings from RUNIFOLD_* variables, with the command's options over them."""
        env = os.environ if env is None else env
        listen = str(options.get("listen") or env.get("RUNIFOLD_MCP_LISTEN", "127.0.0.1:8765"))
        host, sep, port = listen.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise SettingsError(f"RUNIFOLD_MCP_LISTEN (--listen) must be host:port, got {listen!r}")
        auth = str(options.get("auth") or env.get("RUNIFOLD_MCP_AUTH", "none"))
        if auth not in {"none", "bearer"}:
            raise SettingsError(f"RUNIFOLD_MCP_AUTH (--auth) must be none or bearer, got {auth!r}")
        transport = str(options.get("transport") or "stdio")
        if transport not in {"stdio", "http"}:
            raise SettingsError(f"--transport must be stdio or http, got {transport!r}")
        try:
            timeout = float(env.get("RUNIFOLD_MCP_TIMEOUT_S", "30"))
        except ValueError:
            raise SettingsError("RUNIFOLD_MCP_TIMEOUT_S must be a number of seconds") from None
        watched = env.get("RUNIFOLD_MCP_MAX_WATCHED", "16")
        if not watched.isdigit() or not 1 <= int(watched) <= 1024:
            raise SettingsError("RUNIFOLD_MCP_MAX_WATCHED must be 1..1024")
        settings = cls(
            target=str(options.get("target") or env.get("RUNIFOLD_TARGET") or DEFAULT_TARGET),
            token=str(options.get("token") or env.get("RUNIFOLD_TOKEN", "")),
            namespace=str(options.get("namespace") or env.get("RUNIFOLD_NAMESPACE", "")),
            transport=transport,
            host=host.strip("[]"),
            port=int(port),
            auth=auth,
            allow_insecure=env.get("RUNIFOLD_ALLOW_INSECURE", "").lower() in {"1", "true", "yes"},
            timeout_s=timeout,
            max_watched=int(watched),
        )
        settings.check()
        return settings

    def check(self) -> None:
        """Refuse what cannot be safe: an unauthenticated listener beyond loopback."""
        if self.transport == "stdio" and self.auth != "none":
            raise SettingsError("RUNIFOLD_MCP_AUTH=bearer is for --transport http")
        if self.timeout_s <= 0:
            raise SettingsError("RUNIFOLD_MCP_TIMEOUT_S must be positive")
        if self.auth == "none" and not self.token and not self.namespace:
            # With a token, Runifold takes the one namespace it grants; without either,
            # every call would be refused.
            raise SettingsError(
                "no namespace: set RUNIFOLD_NAMESPACE (--namespace) or RUNIFOLD_TOKEN (--token)"
            )
        if (
            self.transport == "http"
            and self.auth == "none"
            and not is_loopback(self.host)
            and not self.allow_insecure
        ):
            raise SettingsError(
                f"refusing to listen on {self.host}:{self.port} with RUNIFOLD_MCP_AUTH=none: "
                "every caller would act as this process's identity; set RUNIFOLD_MCP_AUTH=bearer "
                "(each request brings its own token), or RUNIFOLD_ALLOW_INSECURE=1"
            )
