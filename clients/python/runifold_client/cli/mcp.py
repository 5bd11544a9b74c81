"""`runifold mcp`: serve Runifold to MCP clients (runifold_client.mcp, the `mcp` extra)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from runifold_client.cli.options import _add
from runifold_client.cli.output import Output, UsageError

HELP = """\
transports:
  stdio  one local MCP client starts this command; it calls Runifold with
         RUNIFOLD_TOKEN (or none) in RUNIFOLD_NAMESPACE (or the token's one namespace)
  http   Streamable HTTP at http://HOST:PORT/mcp; with --auth bearer each request's
         own bearer token is the identity Runifold sees; without, loopback only
         (RUNIFOLD_ALLOW_INSECURE=1 to override)

environment:
  RUNIFOLD_TARGET       the Runifold server's host:port (default 127.0.0.1:50051)
  RUNIFOLD_NAMESPACE    the namespace (default: the one the token grants)
  RUNIFOLD_TOKEN        the bearer token of stdio and of http without --auth
  RUNIFOLD_MCP_LISTEN   --listen's default (127.0.0.1:8765)
  RUNIFOLD_MCP_AUTH     --auth's default (none)
  RUNIFOLD_MCP_TIMEOUT_S  the deadline of each call to Runifold (default 30)"""


def add_parser(commands: Any, common: Sequence[argparse.ArgumentParser]) -> None:
    parser = _add(commands, "mcp", "serve memories and conversations to MCP clients", common)
    parser.epilog = HELP
    parser.add_argument(
        "--transport", choices=("stdio", "http"), default="stdio", help="how clients connect"
    )
    parser.add_argument(
        "--listen", metavar="HOST:PORT", help="http: the address (default: $RUNIFOLD_MCP_LISTEN)"
    )
    parser.add_argument(
        "--auth",
        choices=("none", "bearer"),
        help="http: bearer takes each request's token as the caller's identity",
    )
    parser.set_defaults(handler=cmd_mcp)


def cmd_mcp(args: argparse.Namespace, output: Output) -> int:
    try:
        from runifold_client.mcp import McpSettings, SettingsError
        from runifold_client.mcp.run import main
    except ImportError as error:
        raise UsageError(
            f"runifold mcp needs the mcp extra: pip install 'runifold-client[mcp]' ({error})"
        ) from None
    try:
        settings = McpSettings.from_env(
            transport=args.transport,
            listen=args.listen,
            auth=args.auth,
            target=args.target,
            namespace=args.namespace,
            token=args.token,
        )
    except SettingsError as error:
        raise UsageError(str(error)) from None
    return main(settings)
