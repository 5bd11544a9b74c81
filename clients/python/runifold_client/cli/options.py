"""The parts of the parser every command group shares: the connection options, the help
layout, and the client a command calls the server with."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from runifold_client.cli.output import UsageError
from runifold_client.client import DEFAULT_TARGET, Client

ENVIRONMENT = """\
environment:
  RUNIFOLD_TARGET     the server's host:port (default 127.0.0.1:50051)
  RUNIFOLD_NAMESPACE  the namespace, when --namespace is not given
  RUNIFOLD_TOKEN      a bearer token (JWT), when --token is not given"""


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Help with the epilog's layout kept, and each option's default shown (when it has
    one worth showing: not None, not empty, not a switch that is off)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or "default" in text
            or default is None
            or default is False
            or default == ""
            or default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


def _connection() -> argparse.ArgumentParser:
    """The options every command that calls the server takes."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection and output")
    group.add_argument(
        "--target",
        metavar="HOST:PORT",
        help=f"the server's address (default: $RUNIFOLD_TARGET, else {DEFAULT_TARGET})",
    )
    group.add_argument(
        "--namespace",
        "-n",
        metavar="NAME",
        help="the namespace (tenant) to work in (default: $RUNIFOLD_NAMESPACE)",
    )
    group.add_argument(
        "--token", metavar="JWT", help="a bearer token for the server (default: $RUNIFOLD_TOKEN)"
    )
    group.add_argument(
        "--timeout", type=float, default=60.0, metavar="SECONDS", help="deadline of each call"
    )
    group.add_argument(
        "--json",
        action="store_true",
        help="print JSON: every field, zero values included (one document per line for listings)",
    )
    return common


def _add(
    commands: Any, name: str, help: str, parents: Sequence[argparse.ArgumentParser], **kwargs: Any
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=help,
        description=help[:1].upper() + help[1:] + ".",
        parents=list(parents),
        formatter_class=Formatter,
        epilog=ENVIRONMENT,
        **kwargs,
    )
    return parser


def _group(commands: Any, name: str, help: str, dest: str) -> tuple[argparse.ArgumentParser, Any]:
    parser = _add(commands, name, help, ())
    parser.set_defaults(group=parser)
    return parser, parser.add_subparsers(dest=dest, metavar="COMMAND", title="commands")


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


def _client(args: argparse.Namespace) -> Client:
    namespace = args.namespace or os.environ.get("RUNIFOLD_NAMESPACE", "")
    token = args.token or os.environ.get("RUNIFOLD_TOKEN", "")
    if not namespace and not token:
        # With a token whose identity grants exactly one namespace, the server picks it.
        raise UsageError("no namespace: pass --namespace NAME or set RUNIFOLD_NAMESPACE")
    target = args.target or os.environ.get("RUNIFOLD_TARGET", "") or DEFAULT_TARGET
    args.target = target
    return Client(target, namespace=namespace, token=token or None, timeout=args.timeout)


def _pairs(values: Sequence[str] | None, flag: str) -> dict[str, str]:
    pairs = {}
    for value in values or ():
        key, sep, item = value.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} takes KEY=VALUE, not {value!r}")
        pairs[key] = item
    return pairs
