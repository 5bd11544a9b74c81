"""The parts of the parser every command group shares: the connection options, the help
layout, and the client a command calls the server with."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from runifold_client.cli.output import UsageError
from runifold_client.client import DEFAULT_TARGET, Client
from runifold_client.client.connection import from_environment

# The deadline of each call, in seconds (--timeout).
DEFAULT_TIMEOUT = 60.0

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


def _connection(*, defaults: bool = False) -> argparse.ArgumentParser:
    """The options every command that calls the server takes.

    They go anywhere: before the command, after it, between a group and its command
    (`runifold --target X turn hi`, `runifold turn hi --target X`,
    `runifold transcript --json list`). The root parser holds their defaults
    (`defaults=True`); every other parser's copy defaults to SUPPRESS, so that a
    subcommand's parser, which fills its own namespace and copies it over the root's,
    never overwrites a value given earlier on the line with its default."""

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection and output")
    group.add_argument(
        "--target",
        metavar="HOST:PORT",
        default=default(None),
        help=f"the server's address (default: $RUNIFOLD_TARGET, else {DEFAULT_TARGET})",
    )
    group.add_argument(
        "--namespace",
        "-n",
        metavar="NAME",
        default=default(None),
        help="the namespace (tenant) to work in (default: $RUNIFOLD_NAMESPACE)",
    )
    group.add_argument(
        "--token",
        metavar="JWT",
        default=default(None),
        help="a bearer token for the server (default: $RUNIFOLD_TOKEN)",
    )
    group.add_argument(
        "--timeout",
        type=float,
        default=default(DEFAULT_TIMEOUT),
        metavar="SECONDS",
        help=f"deadline of each call (default: {DEFAULT_TIMEOUT})",
    )
    group.add_argument(
        "--json",
        action="store_true",
        default=default(False),
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


def _group(
    commands: Any,
    name: str,
    help: str,
    dest: str,
    parents: Sequence[argparse.ArgumentParser] = (),
) -> tuple[argparse.ArgumentParser, Any]:
    parser = _add(commands, name, help, parents)
    parser.set_defaults(group=parser)
    return parser, parser.add_subparsers(dest=dest, metavar="COMMAND", title="commands")


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


def _client(args: argparse.Namespace) -> Client:
    """The client of a command: the flags given, else RUNIFOLD_TARGET, RUNIFOLD_NAMESPACE
    and RUNIFOLD_TOKEN (as every client reads them), else the defaults."""
    target, namespace, token = from_environment(args.target, args.namespace, args.token)
    if not namespace and not token:
        # With a token whose identity grants exactly one namespace, the server picks it.
        raise UsageError("no namespace: pass --namespace NAME or set RUNIFOLD_NAMESPACE")
    args.target = target
    return Client(target, namespace=namespace, token=token or "", timeout=args.timeout)


def _pairs(values: Sequence[str] | None, flag: str) -> dict[str, str]:
    pairs = {}
    for value in values or ():
        key, sep, item = value.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} takes KEY=VALUE, not {value!r}")
        pairs[key] = item
    return pairs
