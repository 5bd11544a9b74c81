"""The `runifold` command: run the services, chat, and inspect state from a terminal.

    runifold serve [all|transcript|summary|memory|agent]
    runifold chat --namespace tenant-42 [--conversation ID] [--memory 8]
    runifold transcript show ID --namespace tenant-42
    runifold memory add "fact" --conversation ID --from 1 --through 2 --namespace tenant-42
    runifold memory search "question" --namespace tenant-42
    runifold memory forget --conversation ID --namespace tenant-42
    runifold memory propose ID --from 1 --through 40 --namespace tenant-42 [--yes] [--json]
    runifold backlog --namespace tenant-42
    runifold reindex

Every command that prints data takes --json for scripts; people get tables.
The target is --target or RUNIFOLD_TARGET (default 127.0.0.1:50051); a bearer
token comes from --token or RUNIFOLD_TOKEN.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message as ProtoMessage
from rich.console import Console
from rich.table import Table

from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold_client.client import DEFAULT_TARGET, Client
from runifold_client.errors import RunifoldError, SummaryRequired
from runifold_client.policy import ConversationContextPolicy

# 1: "user", 2: "assistant", ... from the proto enum (ROLE_UNSPECIFIED prints as "?").
_ROLES = {
    value: name.removeprefix("ROLE_").lower()
    for name, value in common_pb2.Role.items()
    if value != common_pb2.ROLE_UNSPECIFIED
}


def _client(args: argparse.Namespace) -> Client:
    return Client(args.target, namespace=args.namespace, token=args.token or None)


def _dump(value: ProtoMessage | Sequence[ProtoMessage]) -> str:
    def plain(item: ProtoMessage) -> dict[str, Any]:
        return MessageToDict(item, preserving_proto_field_name=True)

    if isinstance(value, Sequence):
        return json.dumps([plain(v) for v in value], indent=2)
    return json.dumps(plain(value), indent=2)


def _print_error(console: Console, error: RunifoldError) -> None:
    console.print(f"[red]{error.code.name} {error.reason}[/red]: {error.message}")


def cmd_serve(args: argparse.Namespace) -> int:
    # The services' own entry points (`python -m services`, `python -m services.<name>`).
    module = "services" if args.service == "all" else f"services.{args.service}"
    os.execv(sys.executable, [sys.executable, "-m", module])  # noqa: S606


def cmd_transcript_show(args: argparse.Namespace, console: Console) -> int:
    with _client(args) as client:
        entries = list(client.entries(args.conversation_id, after_sequence=args.after))
    if args.json:
        print(_dump(entries))
        return 0
    table = Table(title=f"conversation {args.conversation_id}")
    for column in ("seq", "role", "text", "tool"):
        table.add_column(column)
    for entry in entries:
        message = entry.message
        tool = ", ".join(f"{c.name}({c.id})" for c in message.tool_calls) or message.tool_call_id
        table.add_row(str(entry.sequence), _ROLES.get(message.role, "?"), message.text, tool)
    console.print(table)
    return 0


_ACTIONS = {
    memory_pb.PROPOSAL_ACTION_ADD: "add",
    memory_pb.PROPOSAL_ACTION_SUPERSEDE: "supersede",
    memory_pb.PROPOSAL_ACTION_DUPLICATE: "duplicate",
}


def _picked(answer: str, count: int) -> list[int]:
    """The proposals a person picked: "all", "none" / "", or numbers like "1,3 4"."""
    answer = answer.strip().lower()
    if answer in {"all", "a", "y", "yes"}:
        return list(range(count))
    if answer in {"none", "n", "no"}:
        return []
    picked = []
    for part in answer.replace(",", " ").split():
        if not part.isdigit() or not 1 <= int(part) <= count:
            raise ValueError(f"not a proposal number: {part}")
        picked.append(int(part) - 1)
    return sorted(set(picked))


def cmd_memory_propose(args: argparse.Namespace, console: Console, client: Client) -> int:
    """Show the proposals for a transcript range; store the ones a person picks (all of
    them with --yes). A duplicate is never stored again."""
    reply = client.propose_memories(
        args.conversation_id,
        from_sequence=args.from_sequence,
        through_sequence=args.through_sequence,
        max_proposals=args.max,
    )
    proposals = list(reply.proposals)
    storable = [
        i for i, p in enumerate(proposals) if p.action != memory_pb.PROPOSAL_ACTION_DUPLICATE
    ]
    if not args.json:
        span = f"{args.from_sequence}..{args.through_sequence}"
        table = Table(title=f"proposals from {args.conversation_id} {span}")
        for column in ("#", "action", "content", "sources", "related", "reason"):
            table.add_column(column)
        for i, p in enumerate(proposals, 1):
            sources = ", ".join(f"{s.from_sequence}..{s.through_sequence}" for s in p.sources)
            table.add_row(
                str(i),
                _ACTIONS.get(p.action, "?"),
                p.content,
                sources,
                ", ".join(p.related_memory_ids) or "-",
                p.reason,
            )
        console.print(table)
        if reply.dropped_count:
            console.print(f"[dim]{reply.dropped_count} malformed proposals dropped[/dim]")
    if args.yes:
        chosen = storable
    elif args.json or not storable or not sys.stdin.isatty():
        # Nothing to ask, or no one to ask: show only (--yes stores them).
        chosen = []
    else:
        try:
            answer = console.input("store which? [dim](e.g. 1,3 / all / none)[/dim] ")
        except (EOFError, KeyboardInterrupt):
            answer = ""
        try:
            chosen = [i for i in _picked(answer, len(proposals)) if i in storable]
        except ValueError as error:
            console.print(f"[red]{error}[/red]")
            return 2
    stored = [client.confirm_proposal(proposals[i]) for i in chosen]
    if args.json:
        print(
            json.dumps(
                {
                    "proposals": [
                        MessageToDict(p, preserving_proto_field_name=True) for p in proposals
                    ],
                    "dropped_count": reply.dropped_count,
                    "stored": [
                        MessageToDict(r.memory, preserving_proto_field_name=True) for r in stored
                    ],
                },
                indent=2,
            )
        )
        return 0
    for written in stored:
        superseded = ", ".join(m.memory_id for m in written.superseded)
        console.print(
            f"stored {written.memory.memory_id}"
            + (f" (supersedes {superseded})" if superseded else "")
        )
    return 0


def cmd_memory(args: argparse.Namespace, console: Console) -> int:
    with _client(args) as client:
        if args.memory_command == "propose":
            return cmd_memory_propose(args, console, client)
        if args.memory_command == "add":
            memory = client.remember(
                args.content,
                conversation_id=args.conversation,
                from_sequence=args.from_sequence,
                through_sequence=args.through_sequence,
            )
            print(_dump(memory) if args.json else f"remembered {memory.memory_id}")
            return 0
        if args.memory_command == "search":
            reply = client.search_memories(args.query, limit=args.limit)
            if args.json:
                print(_dump(reply))
                return 0
            table = Table(
                title=f"memories for {args.query!r}"
                + (" (degraded: full-text)" if reply.degraded else "")
            )
            for column in ("score", "memory", "content"):
                table.add_column(column)
            for hit in reply.results:
                table.add_row(f"{hit.score:.3f}", hit.memory.memory_id, hit.memory.content)
            console.print(table)
            return 0
        deleted = client.forget_source(
            args.conversation,
            from_sequence=args.from_sequence,
            through_sequence=args.through_sequence,
        )
        print(json.dumps({"deleted_count": deleted}) if args.json else f"forgot {deleted} memories")
        return 0


def cmd_backlog(args: argparse.Namespace, console: Console) -> int:
    with _client(args) as client:
        reply = client.backlog()
    if args.json:
        print(_dump(reply))
        return 0
    table = Table(title=f"summary backlog of {args.namespace}")
    for column in ("depth", "running", "failed", "oldest pending"):
        table.add_column(column)
    age = reply.oldest_pending_age.seconds + reply.oldest_pending_age.nanos / 1e9
    table.add_row(
        str(reply.depth), str(reply.running_count), str(reply.failed_count), f"{age:.1f}s"
    )
    console.print(table)
    return 0


def cmd_chat(args: argparse.Namespace, console: Console) -> int:
    policy = ConversationContextPolicy(window=args.window)
    if args.memory:
        policy = policy.with_semantic_memory(args.memory)
    if args.auto_summary:
        policy = policy.with_auto_summary(args.auto_summary)
    conversation_id = args.conversation or ""
    console.print("[bold]runifold chat[/bold]: type a message, /quit to leave")
    with _client(args) as client:
        while True:
            try:
                line = console.input("[green]you>[/green] ")
            except (EOFError, KeyboardInterrupt):
                return 0
            if line.strip() in {"/quit", "/exit"}:
                return 0
            if not line.strip():
                continue
            try:
                result = client.run_conversation(
                    line,
                    conversation_id=conversation_id,
                    policy=policy,
                    system_instructions=args.system,
                    create_if_missing=True,
                )
            except SummaryRequired as required:
                console.print(
                    f"[yellow]summary required[/yellow]: {required.backlog} entries "
                    "wait; a background job was enqueued (or use --auto-summary N)"
                )
                continue
            except RunifoldError as error:
                _print_error(console, error)
                continue
            conversation_id = result.conversation_id
            console.print(f"[cyan]assistant>[/cyan] {result.text}")
            context = result.context
            if context is not None:
                console.print(
                    f"[dim]v{result.version} | window {context.window_first_sequence}.."
                    f"{context.window_last_sequence} | summary through "
                    f"{context.summary_through_sequence} | memories "
                    f"{list(context.memory_ids) or '-'} | conversation {conversation_id}[/dim]"
                )


def cmd_reindex(args: argparse.Namespace) -> int:
    # The memory service's own command (progress bar included) does the work.
    os.execv(sys.executable, [sys.executable, "-m", "services.memory", "reindex"])  # noqa: S606


def parser() -> argparse.ArgumentParser:
    """The argument parser of the command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--target", default=os.environ.get("RUNIFOLD_TARGET", DEFAULT_TARGET))
    common.add_argument("--namespace", default=os.environ.get("RUNIFOLD_NAMESPACE", ""))
    common.add_argument("--token", default=os.environ.get("RUNIFOLD_TOKEN", ""))
    common.add_argument("--json", action="store_true", help="machine-readable output")

    root = argparse.ArgumentParser(prog="runifold", description=__doc__.split("\n\n")[0])
    commands = root.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the services (all-in-one by default)")
    serve.add_argument(
        "service",
        nargs="?",
        default="all",
        choices=["all", "transcript", "summary", "memory", "agent"],
    )

    chat = commands.add_parser("chat", parents=[common], help="an interactive conversation")
    chat.add_argument("--conversation", default="", help="continue this conversation")
    chat.add_argument("--window", type=int, default=16)
    chat.add_argument("--memory", type=int, default=8, help="memories per turn (0: off)")
    chat.add_argument("--auto-summary", type=int, default=0, metavar="PASSES")
    chat.add_argument("--system", default="", help="system instructions (never stored)")

    transcript = commands.add_parser("transcript", help="transcripts")
    transcript_commands = transcript.add_subparsers(dest="transcript_command", required=True)
    show = transcript_commands.add_parser("show", parents=[common], help="print a transcript")
    show.add_argument("conversation_id")
    show.add_argument("--after", type=int, default=0)

    memory = commands.add_parser("memory", help="semantic memory")
    memory_commands = memory.add_subparsers(dest="memory_command", required=True)
    add = memory_commands.add_parser("add", parents=[common], help="curate a fact")
    add.add_argument("content")
    add.add_argument("--conversation", required=True)
    add.add_argument("--from", dest="from_sequence", type=int, required=True)
    add.add_argument("--through", dest="through_sequence", type=int, required=True)
    search = memory_commands.add_parser("search", parents=[common], help="semantic search")
    search.add_argument("query")
    search.add_argument("--limit", type=int, default=8)
    forget = memory_commands.add_parser(
        "forget", parents=[common], help="delete what was derived from a conversation"
    )
    forget.add_argument("--conversation", required=True)
    forget.add_argument("--from", dest="from_sequence", type=int, default=0)
    forget.add_argument("--through", dest="through_sequence", type=int, default=0)
    propose = memory_commands.add_parser(
        "propose",
        parents=[common],
        help="propose memories from a transcript range; store the ones you pick",
    )
    propose.add_argument("conversation_id")
    propose.add_argument("--from", dest="from_sequence", type=int, required=True)
    propose.add_argument("--through", dest="through_sequence", type=int, required=True)
    propose.add_argument("--max", type=int, default=0, help="most proposals (0: the server's 8)")
    propose.add_argument("--yes", action="store_true", help="store every proposal but duplicates")

    commands.add_parser("backlog", parents=[common], help="the summary job queue")
    commands.add_parser("reindex", help="rebuild the memory index from PostgreSQL")
    return root


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `runifold` command."""
    args = parser().parse_args(argv)
    console = Console()
    try:
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "reindex":
            return cmd_reindex(args)
        if args.command == "chat":
            return cmd_chat(args, console)
        if args.command == "transcript":
            return cmd_transcript_show(args, console)
        if args.command == "memory":
            return cmd_memory(args, console)
        return cmd_backlog(args, console)
    except RunifoldError as error:
        if getattr(args, "json", False):
            print(
                json.dumps(
                    {
                        "code": error.code.name,
                        "reason": error.reason,
                        "message": error.message,
                        "metadata": error.metadata,
                    }
                )
            )
        else:
            _print_error(console, error)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
