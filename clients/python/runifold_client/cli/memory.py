"""`runifold memory ...`: curated semantic memory (add, get, list, search, delete, forget),
and proposals from a transcript range that a person picks from, and the change feed of a
namespace's memories (watch). A memory's sources are transcript ranges or external URIs
(--uri)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from rich.markup import escape
from rich.table import Table

from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold_client.cli import interrupts
from runifold_client.cli.options import _add, _client, _group, _pairs
from runifold_client.cli.output import Output, UsageError, plain
from runifold_client.client import Client, source


def _source(source: Any) -> str:
    """Where a memory came from: a transcript range, or an external URI."""
    if source.external_uri:
        return str(source.external_uri)
    return f"{source.conversation_id[:8]}…:{source.from_sequence}..{source.through_sequence}"


def _memory_row(memory: Any) -> Sequence[str]:
    sources = ", ".join(_source(s) for s in memory.sources)
    return (memory.memory_id, str(memory.revision), memory.content, sources)


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
    if answer in {"", "none", "n", "no"}:
        return []
    picked = []
    for part in answer.replace(",", " ").split():
        if not part.isdigit() or not 1 <= int(part) <= count:
            raise UsageError(f"not a proposal number: {part} (1..{count}, all or none)")
        picked.append(int(part) - 1)
    return sorted(set(picked))


def _proposal_row(numbered: tuple[int, Any]) -> Sequence[str]:
    number, proposal = numbered
    return (
        str(number),
        _ACTIONS.get(proposal.action, "?"),
        proposal.content,
        ", ".join(f"{s.from_sequence}..{s.through_sequence}" for s in proposal.sources),
        ", ".join(proposal.related_memory_ids) or "-",
        proposal.reason,
    )


def cmd_memory_propose(args: argparse.Namespace, output: Output, client: Client) -> int:
    """Show the proposals for a transcript range; store the ones a person picks (all but
    duplicates with --yes; nothing without --yes when no one can be asked). A duplicate is
    never stored again."""
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
    if not output.json:
        span = f"{args.from_sequence}..{args.through_sequence}"
        table = Table(title=f"proposals from {args.conversation_id} {span}")
        for column in ("#", "action", "content", "sources", "related", "reason"):
            table.add_column(column)
        for number, proposal in enumerate(proposals, 1):
            table.add_row(*(escape(cell) for cell in _proposal_row((number, proposal))))
        if proposals:
            output.console.print(table)
        else:
            output.line(f"no proposals from {args.conversation_id} {span}")
        if reply.dropped_count:
            output.line(f"[dim]{reply.dropped_count} malformed proposals dropped[/dim]")
    if args.yes:
        chosen = storable
    elif output.json or not storable or not sys.stdin.isatty():
        chosen = []  # nothing to ask, or no one to ask: show only (--yes stores them)
    else:
        try:
            answer = output.console.input("store which? [dim](e.g. 1,3 / all / none)[/dim] ")
        except EOFError:
            answer = ""
        except KeyboardInterrupt:
            interrupts.handled()  # an answer: none
            answer = ""
        chosen = [i for i in _picked(answer, len(proposals)) if i in storable]
    stored = [client.confirm_proposal(proposals[i]) for i in chosen]
    if output.json:
        output.document(
            {
                "proposals": [plain(p) for p in proposals],
                "dropped_count": reply.dropped_count,
                "stored": [plain(r.memory) for r in stored],
            }
        )
        return 0
    for written in stored:
        superseded = ", ".join(m.memory_id for m in written.superseded)
        output.line(
            f"stored {written.memory.memory_id}"
            + (f" (supersedes {superseded})" if superseded else "")
        )
    return 0


# MemoryEventKind's values, as the feed prints them.
_KINDS = {
    memory_pb.MEMORY_EVENT_KIND_CREATED: "created",
    memory_pb.MEMORY_EVENT_KIND_UPDATED: "updated",
    memory_pb.MEMORY_EVENT_KIND_SUPERSEDED: "superseded",
    memory_pb.MEMORY_EVENT_KIND_DELETED: "deleted",
    memory_pb.MEMORY_EVENT_KIND_EXPIRED: "expired",
    memory_pb.MEMORY_EVENT_KIND_ERASED: "erased",
}


def cmd_memory_watch(args: argparse.Namespace, output: Output, client: Client) -> int:
    """Follow the namespace's memories like `tail -f`: every change after --after, each
    once and in order, then the changes as they commit; resumes by itself when the stream
    breaks. Runs until interrupted (Ctrl-C ends it quietly)."""
    heartbeats = args.heartbeats
    for event in client.watch_memories(
        after_change_sequence=args.after, heartbeat_interval=args.heartbeat or None
    ):
        kind = event.WhichOneof("event")
        if output.json:
            if kind != "heartbeat" or heartbeats:
                output.message(event)
            continue
        if kind == "change":
            change = event.change
            what = _KINDS.get(change.kind, "changed")
            text = f" {change.memory.content}" if change.HasField("memory") else ""
            output.console.print(
                f"{change.change_sequence:>6} {what:<10} {change.memory_id} "
                f"r{change.revision}{escape(text)}"
            )
        elif kind == "heartbeat" and heartbeats:
            output.line(f"[dim]       caught up: change {event.heartbeat.change_sequence}[/dim]")
    return 0


def cmd_memory(args: argparse.Namespace, output: Output) -> int:
    with _client(args) as client:
        command = args.memory_command
        if command == "propose":
            return cmd_memory_propose(args, output, client)
        if command == "watch":
            return cmd_memory_watch(args, output, client)
        if command == "add":
            ranged = bool(args.conversation or args.from_sequence or args.through_sequence)
            if args.uri and ranged:
                raise UsageError("give a transcript range or --uri, not both")
            if not args.uri and not (
                args.conversation and args.from_sequence and args.through_sequence
            ):
                raise UsageError("give --conversation ID --from SEQ --through SEQ, or --uri URI")
            sources = (
                [source(external_uri=args.uri)]
                if args.uri
                else [source(args.conversation, args.from_sequence, args.through_sequence)]
            )
            written = client.upsert_memory(
                args.content, sources=sources, metadata=_pairs(args.metadata, "--metadata")
            )
            output.fields("remembered", written.memory)
        elif command == "get":
            output.fields(f"memory {args.memory_id}", client.get_memory(args.memory_id))
        elif command == "list":
            output.rows(
                f"memories of {client.namespace}",
                ("memory", "rev", "content", "sources"),
                client.list_memories(conversation_id=args.conversation),
                _memory_row,
            )
        elif command == "search":
            reply = client.search_memories(
                args.query,
                limit=args.limit,
                min_score=args.min_score,
                metadata_filter=_pairs(args.filter, "--filter"),
                mode=args.mode,
            )
            if output.json:
                output.message(reply)
            else:
                title = f"memories for {args.query!r}" + (
                    " (degraded: full-text, the index is down)" if reply.degraded else ""
                )
                output.rows(
                    title,
                    ("score", "memory", "content"),
                    reply.results,
                    lambda hit: (f"{hit.score:.3f}", hit.memory.memory_id, hit.memory.content),
                )
        elif command == "delete":
            deleted = client.delete_memory(args.memory_id, expected_revision=args.expected_revision)
            if output.json:
                output.document({"deleted": deleted})
            else:
                output.line(f"{'deleted' if deleted else 'already gone'}: {args.memory_id}")
        else:  # forget
            if bool(args.conversation) == bool(args.uri):
                raise UsageError("give --conversation ID (and a range) or --uri URI")
            count = client.forget_source(
                args.conversation,
                from_sequence=args.from_sequence,
                through_sequence=args.through_sequence,
                external_uri=args.uri,
            )
            if output.json:
                output.document({"deleted_count": count})
            else:
                output.line(f"forgot {count} memories")
    return 0


def add_parser(commands: Any, common: Sequence[argparse.ArgumentParser]) -> None:
    """The `memory` group."""
    _, memory = _group(commands, "memory", "curated semantic memory", "memory_command", common)
    add = _add(memory, "add", "curate a fact from a transcript range (or an external URI)", common)
    add.add_argument("content", help="the fact")
    add.add_argument(
        "--conversation", "-c", default="", metavar="ID", help="the source conversation"
    )
    add.add_argument(
        "--from",
        dest="from_sequence",
        type=int,
        default=0,
        metavar="SEQ",
        help="first sequence of the source range",
    )
    add.add_argument(
        "--through",
        dest="through_sequence",
        type=int,
        default=0,
        metavar="SEQ",
        help="last sequence of the source range",
    )
    add.add_argument(
        "--uri",
        default="",
        metavar="URI",
        help="instead of a range: the source outside a transcript (an absolute URI, e.g. "
        "mcp://notes/42)",
    )
    add.add_argument(
        "--metadata", action="append", metavar="KEY=VALUE", help="an annotation (repeatable)"
    )
    get_memory = _add(memory, "get", "one memory", common)
    get_memory.add_argument("memory_id", metavar="ID", help="the memory's id")
    list_memories = _add(memory, "list", "list the memories of the namespace", common)
    list_memories.add_argument(
        "--conversation",
        "-c",
        default="",
        metavar="ID",
        help="only memories with a source in this conversation",
    )
    search = _add(memory, "search", "semantic search in the namespace", common)
    search.add_argument("query", help="the question")
    search.add_argument("--limit", type=int, default=8, help="results at most (1..256)")
    search.add_argument(
        "--min-score",
        type=float,
        default=0.0,
        help="only results scoring at least this (cosine, -1..1; 0: no minimum)",
    )
    search.add_argument(
        "--mode",
        choices=("dense", "lexical", "hybrid"),
        default="",
        help="rank by the cosine, by BM25 over the words, or both fused (default: the "
        "server's, hybrid unless configured)",
    )
    search.add_argument(
        "--filter",
        action="append",
        metavar="KEY=VALUE",
        help="only memories with this metadata (repeatable)",
    )
    delete_memory = _add(memory, "delete", "delete a memory", common)
    delete_memory.add_argument("memory_id", metavar="ID", help="the memory's id")
    delete_memory.add_argument(
        "--expected-revision",
        type=int,
        metavar="N",
        help="delete only at this revision (default: any)",
    )
    forget = _add(
        memory, "forget", "delete what was derived from a conversation or an external URI", common
    )
    forget.add_argument(
        "--conversation", "-c", default="", metavar="ID", help="the source conversation"
    )
    forget.add_argument(
        "--uri",
        default="",
        metavar="URI",
        help="instead of a conversation: every memory with this external source (exactly)",
    )
    forget.add_argument(
        "--from",
        dest="from_sequence",
        type=int,
        default=0,
        metavar="SEQ",
        help="first sequence of the range (0 with --through 0: all of it)",
    )
    forget.add_argument(
        "--through",
        dest="through_sequence",
        type=int,
        default=0,
        metavar="SEQ",
        help="last sequence of the range",
    )
    propose = _add(
        memory, "propose", "propose memories from a transcript range; store those you pick", common
    )
    propose.add_argument("conversation_id", metavar="ID", help="the conversation")
    propose.add_argument(
        "--from",
        dest="from_sequence",
        type=int,
        required=True,
        metavar="SEQ",
        help="first sequence of the range",
    )
    propose.add_argument(
        "--through",
        dest="through_sequence",
        type=int,
        required=True,
        metavar="SEQ",
        help="last sequence of the range",
    )
    propose.add_argument(
        "--max", type=int, default=0, metavar="N", help="proposals at most (0: the server's 8)"
    )
    propose.add_argument(
        "--yes", action="store_true", help="store every proposal but duplicates, without asking"
    )
    watch = _add(
        memory,
        "watch",
        "follow the namespace's memories like tail -f: every change, once, in order",
        common,
    )
    watch.add_argument(
        "--after",
        type=int,
        default=0,
        metavar="N",
        help="start after this change sequence (0: replay every change first)",
    )
    watch.add_argument(
        "--heartbeat",
        type=float,
        default=0.0,
        metavar="S",
        help="how often a quiet stream says it is alive, 1..300 s (0: the server's default)",
    )
    watch.add_argument(
        "--heartbeats",
        action="store_true",
        help="print the heartbeats too (with --json: emit them)",
    )
    for choice in memory.choices.values():
        choice.set_defaults(handler=cmd_memory)
