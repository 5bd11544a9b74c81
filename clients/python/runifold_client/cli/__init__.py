"""The `runifold` command: chat with an agent and inspect its state from a terminal.

It talks gRPC only (the client of this distribution), to the all-in-one server
or a gateway in front of the services. People get tables and readable lines;
`--json` prints every field (zero values included) as one JSON document, or
one document per line for listings and streams.

It ends as Unix tools do: Ctrl-C leaves quietly with status 130 (128 + SIGINT), and a
reader that closes the output early (`runifold transcript list --json | head -1`) ends
it quietly with status 141 (128 + SIGPIPE, what `yes | head -1` reports for `yes`).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

import grpc
from rich.console import Console

import runifold_client
from runifold_client.cli import chat, interrupts, mcp, memory, summary, transcript, turn
from runifold_client.cli.memory import _picked
from runifold_client.cli.options import ENVIRONMENT, Formatter, _connection
from runifold_client.cli.output import Output, UsageError, _print_error, plain
from runifold_client.errors import RunifoldError

EXAMPLES = """\
examples:
  runifold chat --namespace tenant-42 --memory 8
  runifold turn "What did we decide?" --namespace tenant-42 --conversation ID
  runifold transcript list --namespace tenant-42
  runifold transcript show ID --namespace tenant-42
  runifold transcript watch ID --namespace tenant-42 --json
  runifold memory search "when do we ship" --namespace tenant-42 --json
  runifold memory propose ID --from 1 --through 40 --namespace tenant-42
  runifold backlog --namespace tenant-42
  runifold mcp --transport http --auth bearer --listen 0.0.0.0:8765"""

# The commands in the order `runifold --help` lists them.
_COMMANDS = (
    chat.add_parser,
    turn.add_parser,
    transcript.add_parser,
    summary.add_parser,
    memory.add_parser,
    summary.add_backlog_parser,
    transcript.add_erase_parser,
    mcp.add_parser,
)


def parser() -> argparse.ArgumentParser:
    """The argument parser of the command: each group adds its commands."""
    common = [_connection()]
    root = argparse.ArgumentParser(
        prog="runifold",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=f"{EXAMPLES}\n\n{ENVIRONMENT}",
        formatter_class=Formatter,
        parents=[_connection(defaults=True)],
    )
    root.add_argument(
        "--version", action="version", version=f"runifold {runifold_client.__version__}"
    )
    root.set_defaults(group=root)
    commands = root.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for add in _COMMANDS:
        add(commands, common)
    return root


def _usage_error(message: str) -> NoReturn:
    print(f"runifold: {message}", file=sys.stderr)
    raise SystemExit(2)


# Exit statuses of a command a signal ended (128 + the signal's number), as shells report.
INTERRUPTED = interrupts.INTERRUPTED
PIPE_CLOSED = 141  # SIGPIPE: the reader of the output went away


class _Console(Console):
    """rich's console, which ends the program (status 1) when its output is closed: here
    the closed output is raised, for `main` to end with the status a pipe gives."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `runifold` command: its exit status.

    Ctrl-C ends it with 130, a closed output with 141 (the output then goes nowhere:
    Python's flush at exit finds nothing to complain about); never with a traceback."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, interrupts.interrupted)
    try:
        return _run(argv)
    except KeyboardInterrupt:
        return INTERRUPTED
    except BrokenPipeError:
        # https://docs.python.org/3/library/signal.html#note-on-sigpipe
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return PIPE_CLOSED


def _run(argv: Sequence[str] | None) -> int:
    args = parser().parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:  # a bare command or group: its help
        args.group.print_help()
        return 0
    output = Output(json=args.json, console=_Console(highlight=False))
    try:
        return int(handler(args, output))
    except UsageError as error:
        _usage_error(str(error))
    except RunifoldError as error:
        _print_error(output, error, args)
        return 1
    except grpc.RpcError as error:  # an iterator's call outside the client's mapping
        print(f"runifold: {error}", file=sys.stderr)
        return 1


__all__ = ["Output", "UsageError", "_picked", "main", "parser", "plain"]
