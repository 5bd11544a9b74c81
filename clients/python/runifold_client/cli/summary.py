"""`runifold summary ...`: a conversation's summary (show, run, request), and `runifold
backlog`: the summary job queue of the namespace."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from runifold_client.cli.options import _add, _client, _group
from runifold_client.cli.output import Output


def cmd_summary(args: argparse.Namespace, output: Output) -> int:
    with _client(args) as client:
        command = args.summary_command
        if command == "show":
            summary = client.get_summary(args.conversation_id)
            if summary is None:
                if output.json:
                    output.document({"summary": None})
                else:
                    output.line(f"conversation {args.conversation_id} has no summary yet")
            else:
                output.fields(f"summary of {args.conversation_id}", summary)
        elif command == "run":
            reply = client.summarize(
                args.conversation_id,
                window=args.window,
                summary_batch=args.summary_batch,
                max_summary_passes=args.passes,
            )
            output.fields(f"summarized {args.conversation_id}", reply)
        else:  # request
            job = client.request_summary(
                args.conversation_id, window=args.window, summary_batch=args.summary_batch
            )
            output.fields(f"summary job of {args.conversation_id}", job)
    return 0


def cmd_backlog(args: argparse.Namespace, output: Output) -> int:
    with _client(args) as client:
        reply = client.backlog()
    if output.json:
        output.message(reply)
        return 0
    table = Table(title=f"summary backlog of {client.namespace}")
    for column in ("waiting or running", "running", "failed", "oldest waiting"):
        table.add_column(column)
    age = reply.oldest_pending_age.ToTimedelta().total_seconds()
    table.add_row(
        str(reply.depth), str(reply.running_count), str(reply.failed_count), f"{age:.1f}s"
    )
    output.console.print(table)
    return 0


def add_parser(commands: Any, common: Sequence[argparse.ArgumentParser]) -> None:
    """The `summary` group."""
    _, summary = _group(
        commands, "summary", "summaries of old transcript entries", "summary_command", common
    )
    show_summary = _add(summary, "show", "a conversation's current summary", common)
    show_summary.add_argument("conversation_id", metavar="ID", help="the conversation's id")
    run = _add(summary, "run", "summarize a conversation now", common)
    run.add_argument("conversation_id", metavar="ID", help="the conversation's id")
    request = _add(summary, "request", "enqueue background summarization", common)
    request.add_argument("conversation_id", metavar="ID", help="the conversation's id")
    for sub_parser in (run, request):
        sub_parser.add_argument(
            "--window",
            type=int,
            default=16,
            metavar="N",
            help="recent entries kept out of the summary",
        )
        sub_parser.add_argument(
            "--summary-batch", type=int, default=64, metavar="N", help="entries per pass"
        )
    run.add_argument("--passes", type=int, default=1, metavar="N", help="passes at most (1..64)")
    for choice in summary.choices.values():
        choice.set_defaults(handler=cmd_summary)


def add_backlog_parser(commands: Any, common: Sequence[argparse.ArgumentParser]) -> None:
    """The `backlog` command."""
    backlog = _add(commands, "backlog", "the summary job queue of the namespace", common)
    backlog.set_defaults(handler=cmd_backlog)
