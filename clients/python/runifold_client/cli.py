"""The `runifold` command: chat with an agent and inspect its state from a terminal.

It talks gRPC only (the client of this distribution), to the all-in-one server
or a gateway in front of the services. People get tables and readable lines;
`--json` prints every field (zero values included) as one JSON document, or
one document per line for listings and streams.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message as ProtoMessage
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import runifold_client
from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold_client.client import DEFAULT_TARGET, Client, ConcurrencyMode, TurnResult
from runifold_client.errors import (
    InvalidArgument,
    ModelOutputInvalid,
    PermissionDenied,
    RunifoldError,
    SummaryRequired,
    TurnConflict,
    Unauthenticated,
    Unavailable,
)
from runifold_client.policy import ConversationContextPolicy, assistant, tool_result, user

ENVIRONMENT = """\
environment:
  RUNIFOLD_TARGET     the server's host:port (default 127.0.0.1:50051)
  RUNIFOLD_NAMESPACE  the namespace, when --namespace is not given
  RUNIFOLD_TOKEN      a bearer token (JWT), when --token is not given"""

EXAMPLES = """\
examples:
  runifold chat --namespace tenant-42 --memory 8
  runifold turn "What did we decide?" --namespace tenant-42 --conversation ID
  runifold transcript list --namespace tenant-42
  runifold transcript show ID --namespace tenant-42
  runifold transcript watch ID --namespace tenant-42 --json
  runifold memory search "when do we ship" --namespace tenant-42 --json
  runifold memory propose ID --from 1 --through 40 --namespace tenant-42
  runifold backlog --namespace tenant-42"""

# What to change when the server names a field at fault (google.rpc.BadRequest).
_FLAG_OF_FIELD = {
    "namespace": "--namespace or RUNIFOLD_NAMESPACE",
    "conversation_id": "the conversation id (--conversation, or the ID argument)",
    "limit": "--limit",
    "window": "--window",
    "policy.window": "--window",
    "summary_batch": "--summary-batch",
    "policy.summary_batch": "--summary-batch",
    "policy.memory_limit": "--memory",
    "policy.max_summary_passes": "--auto-summary",
    "max_summary_passes": "--passes",
    "memory_id": "the memory id (the ID argument)",
}
_ROLES = {
    value: name.removeprefix("ROLE_").lower()
    for name, value in common_pb2.Role.items()
    if value != common_pb2.ROLE_UNSPECIFIED
}
_CONCURRENCY = {
    "race": ConcurrencyMode.RACE,
    "reject": ConcurrencyMode.REJECT,
    "enqueue": ConcurrencyMode.ENQUEUE,
}
CHAT_COMMANDS = """\
/help                 this list
/retry                resend the message the server refused
/summarize            summarize the conversation now, then resend a refused message
/drop                 forget a refused message
/new                  start a new conversation
/id                   the conversation's id
/history [N]          the last N entries of the transcript (default 20)
/summary              the conversation's current summary
/memory QUERY         search semantic memory
/quit, /exit          leave (so does Ctrl-D)
A line that starts with // sends the rest of it, slash included."""


# Listing columns that hold ids (UUIDs).
_ID_COLUMNS = frozenset({"conversation", "memory"})


class UsageError(Exception):
    """A mistake in the command line (exit status 2), said in one line."""


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


# -- output ------------------------------------------------------------------------


def plain(message: ProtoMessage) -> dict[str, Any]:
    """A message as JSON-ready data: every field, zero values included, proto field names,
    64-bit integers as numbers."""
    return MessageToDict(
        message,
        always_print_fields_with_no_presence=True,
        preserving_proto_field_name=True,
        unquote_int64_if_possible=True,
    )


@dataclass
class Output:
    """Where a command prints: a rich console for people, JSON lines for scripts."""

    json: bool
    console: Console

    def document(self, value: dict[str, Any]) -> None:
        print(json.dumps(value, ensure_ascii=False), flush=True)

    def message(self, message: ProtoMessage) -> None:
        self.document(plain(message))

    def line(self, text: str) -> None:
        """A line for people (nothing in --json mode)."""
        if not self.json:
            self.console.print(text)

    def fields(self, title: str, message: ProtoMessage) -> None:
        """One resource: a JSON document, or a two-column table of its fields."""
        if self.json:
            self.message(message)
            return
        table = Table(title=title, show_header=False)
        table.add_column("field", style="bold")
        table.add_column("value")
        for key, value in plain(message).items():
            table.add_row(key, escape(_cell(value)))
        self.console.print(table)

    def rows(
        self,
        title: str,
        columns: Sequence[str],
        items: Iterable[ProtoMessage],
        row: Callable[[Any], Sequence[str]],
    ) -> int:
        """A listing: one JSON document per line, or a table. Returns the count."""
        count = 0
        table = Table(title=title)
        for column in columns:
            if column in _ID_COLUMNS:  # ids are what people copy: never cut
                table.add_column(column, no_wrap=True, min_width=36)
            else:
                table.add_column(column)
        for item in items:
            count += 1
            if self.json:
                self.message(item)
            else:
                table.add_row(*(escape(cell) for cell in row(item)))
        if not self.json:
            if count:
                self.console.print(table)
            else:
                self.console.print(f"{title}: none")
        return count


def _cell(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _status_line(result: TurnResult) -> str:
    """What a turn did, for people: version, entries, context, conversation."""
    parts = [
        f"version {result.version}",
        f"entries {result.first_sequence}..{result.last_sequence}",
    ]
    context = result.context
    if context is not None:
        if context.window_last_sequence:
            parts.append(f"window {context.window_first_sequence}..{context.window_last_sequence}")
        parts.append(
            f"summary through {context.summary_through_sequence}"
            if context.summary_through_sequence
            else "no summary"
        )
        if context.summary_passes:
            parts.append(f"{context.summary_passes} summary passes")
        count = len(context.memory_ids)
        memories = f"{count} memor{'y' if count == 1 else 'ies'}"
        parts.append(memories + (" (full-text: index down)" if context.memory_degraded else ""))
    usage = result.outcome.usage
    parts.append(f"{usage.input_tokens}+{usage.output_tokens} tokens")
    if result.replayed:
        parts.append("replayed")
    return " · ".join(parts)


def _error_document(error: RunifoldError) -> dict[str, Any]:
    document: dict[str, Any] = {
        "code": error.code.name,
        "reason": error.reason,
        "message": error.message,
        "metadata": error.metadata,
    }
    if isinstance(error, InvalidArgument) and error.field:
        document["field"] = error.field
    return {"error": document}


def _hint(error: RunifoldError, args: argparse.Namespace) -> str:
    """What fixes the error, when it is one a person meets first."""
    target = getattr(args, "target", None) or DEFAULT_TARGET
    if isinstance(error, Unavailable) and error.reason == "UNAVAILABLE":
        # No ErrorInfo: the call never reached a Runifold server.
        return (
            f"cannot reach a server at {target}: start one (`make run`), or point "
            "--target / RUNIFOLD_TARGET at it"
        )
    if isinstance(error, InvalidArgument) and error.field:
        flag = _FLAG_OF_FIELD.get(error.field)
        if flag:
            return f"check {flag}"
    if isinstance(error, Unauthenticated):
        return "pass a valid token with --token or RUNIFOLD_TOKEN"
    if isinstance(error, PermissionDenied):
        return "the token does not grant this namespace: check --namespace and --token"
    return ""


def _print_error(output: Output, error: RunifoldError, args: argparse.Namespace) -> None:
    if output.json:
        output.document(_error_document(error))
        return
    hint = _hint(error, args)
    output.console.print(
        f"[red]{error.code.name} {error.reason}[/red]: {escape(error.message)}"
        + (f"\n[yellow]hint[/yellow]: {escape(hint)}" if hint else "")
    )


# -- the client of a command -----------------------------------------------------------


def _client(args: argparse.Namespace) -> Client:
    namespace = args.namespace or os.environ.get("RUNIFOLD_NAMESPACE", "")
    token = args.token or os.environ.get("RUNIFOLD_TOKEN", "")
    if not namespace and not token:
        # With a token whose identity grants exactly one namespace, the server picks it.
        raise UsageError("no namespace: pass --namespace NAME or set RUNIFOLD_NAMESPACE")
    target = args.target or os.environ.get("RUNIFOLD_TARGET", "") or DEFAULT_TARGET
    args.target = target
    return Client(target, namespace=namespace, token=token or None, timeout=args.timeout)


def _policy(args: argparse.Namespace) -> ConversationContextPolicy:
    policy = ConversationContextPolicy(window=args.window, summary_batch=args.summary_batch)
    if args.memory:
        policy = policy.with_semantic_memory(args.memory)
    if args.auto_summary:
        policy = policy.with_auto_summary(args.auto_summary)
    return policy


def _pairs(values: Sequence[str] | None, flag: str) -> dict[str, str]:
    pairs = {}
    for value in values or ():
        key, sep, item = value.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} takes KEY=VALUE, not {value!r}")
        pairs[key] = item
    return pairs


# -- commands ------------------------------------------------------------------------


def cmd_turn(args: argparse.Namespace, output: Output) -> int:
    with _client(args) as client:
        options: dict[str, Any] = {
            "conversation_id": args.conversation,
            "policy": _policy(args),
            "system_instructions": args.system,
            "create_if_missing": True,
            "concurrency": _CONCURRENCY[args.concurrency],
            "turn_id": args.turn_id or None,
        }
        if args.stream:
            streamed = False
            for event in client.stream_conversation(args.text, **options):
                kind = event.WhichOneof("event")
                if output.json:
                    output.message(event)
                elif kind == "text_delta":
                    streamed = True
                    output.console.print(escape(event.text_delta.text), end="")
                elif kind == "result":
                    result = TurnResult.from_proto(event.result)
                    output.console.print("" if streamed else escape(result.text))
                    _print_turn_footer(output, result)
            return 0
        result = client.run_conversation(args.text, **options)
    if output.json:
        output.message(result.to_proto())
        return 0
    output.console.print(escape(result.text))
    _print_turn_footer(output, result)
    return 0


def _print_turn_footer(output: Output, result: TurnResult) -> None:
    for call in result.tool_calls:
        output.console.print(
            f"[magenta]tool call[/magenta] {escape(call.name)}({escape(call.arguments_json)})"
        )
    output.console.print(f"[dim]{escape(_status_line(result))}[/dim]")
    output.console.print(f"[dim]conversation {result.conversation_id}[/dim]")


class Chat:
    """An interactive conversation: one turn per line; slash commands run here."""

    def __init__(self, args: argparse.Namespace, output: Output, client: Client) -> None:
        self.args = args
        self.output = output
        self.client = client
        self.policy = _policy(args)
        self.conversation_id: str = args.conversation
        # A message the server refused, kept to resend, with the turn id to resend it under.
        self.kept: str | None = None
        self.kept_turn_id = ""

    def lines(self) -> Iterator[str]:
        while True:
            try:
                if self.output.json or not sys.stdin.isatty():
                    line = sys.stdin.readline()
                    if not line:
                        return
                    if not self.output.json:
                        self.output.console.print(f"[green]you>[/green] {escape(line.rstrip())}")
                else:
                    line = self.output.console.input("[green]you>[/green] ")
            except (EOFError, KeyboardInterrupt):
                return
            yield line.rstrip("\n")

    def run(self) -> int:
        where = f"namespace {self.client.namespace or '(from the token)'} at {self.args.target}"
        self.output.line(
            f"[bold]runifold chat[/bold] ({escape(where)}): type a message; "
            "/help lists the commands, /quit leaves"
        )
        for line in self.lines():
            text = line.strip()
            if not text:
                continue
            if text.startswith("/") and not text.startswith("//"):
                if not self.command(text):
                    return 0
                continue
            if self.kept is not None:
                self.output.line("[dim](the refused message is dropped; this one is sent)[/dim]")
                self.kept = None
            self.send(text.removeprefix("/") if text.startswith("//") else text, "")
        return 0

    def command(self, text: str) -> bool:
        """Run a slash command; False to leave."""
        name, _, rest = text.partition(" ")
        rest = rest.strip()
        if name in {"/quit", "/exit"}:
            return False
        if name == "/help":
            if self.output.json:
                self._say("commands", CHAT_COMMANDS)
            else:
                self.output.console.print(escape(CHAT_COMMANDS), highlight=False)
        elif name == "/retry":
            self.resend()
        elif name == "/summarize":
            self.summarize()
            self.resend(quiet=True)
        elif name == "/drop":
            self._say("dropped", "no message was kept" if self.kept is None else self.kept)
            self.kept = None
        elif name == "/new":
            self.conversation_id = ""
            self._say("new", "the next message starts a new conversation")
        elif name == "/id":
            self._say("conversation", self.conversation_id or "(none yet)")
        elif name == "/history":
            self.history(int(rest) if rest.isdigit() else 20)
        elif name == "/summary":
            self.summary()
        elif name == "/memory":
            if not rest:
                self._say("usage", "/memory QUERY")
            else:
                self.memory(rest)
        else:
            self._say("unknown command", f"{name}: /help lists the commands")
        return True

    def _say(self, what: str, text: str) -> None:
        if self.output.json:
            self.output.document({"chat": what, "text": text})
        else:
            self.output.console.print(f"[dim]{escape(what)}:[/dim] {escape(text)}")

    def send(self, text: str, turn_id: str) -> None:
        turn_id = turn_id or str(uuid.uuid4())
        try:
            result = self.client.run_conversation(
                text,
                conversation_id=self.conversation_id,
                policy=self.policy,
                system_instructions=self.args.system,
                create_if_missing=True,
                turn_id=turn_id,
            )
        except RunifoldError as error:
            self.refused(text, turn_id, error)
            return
        self.kept = None
        self.conversation_id = result.conversation_id
        if self.output.json:
            self.output.message(result.to_proto())
            return
        console = self.output.console
        if result.text:
            console.print(f"[cyan]assistant>[/cyan] {escape(result.text)}")
        for call in result.tool_calls:
            console.print(
                f"[magenta]tool call[/magenta] {escape(call.name)}({escape(call.arguments_json)})"
            )
        console.print(
            f"[dim]{escape(_status_line(result))} · conversation {result.conversation_id}[/dim]"
        )

    def refused(self, text: str, turn_id: str, error: RunifoldError) -> None:
        """Keep the message and say how to resend it."""
        self.kept = text
        # A turn that did its model work keeps its outcome under its id: a resend under
        # the same id would answer the same refusal, so it takes a new one. A turn refused
        # before any model work (summary required, busy, unreachable) keeps its id, so
        # that a resend of one that did commit after all returns it instead of a copy.
        carries_outcome = isinstance(error, TurnConflict | ModelOutputInvalid)
        self.kept_turn_id = "" if carries_outcome else turn_id
        if self.output.json:
            self.output.document({**_error_document(error), "kept": text})
            return
        console = self.output.console
        if isinstance(error, SummaryRequired):
            console.print(
                f"[yellow]not sent[/yellow]: the conversation needs a summary first "
                f"({error.backlog} older entries wait; a background job was enqueued)."
            )
            console.print(
                "[dim]Your message is kept: /summarize summarizes now and resends it, "
                "/retry resends it (once the job is done), /drop forgets it. "
                "`--auto-summary N` summarizes within each turn.[/dim]"
            )
            return
        if isinstance(error, TurnConflict) and error.outcome.text:
            console.print(
                "[yellow]not stored[/yellow]: another writer committed first; this answer "
                f"was not kept: {escape(error.outcome.text)}"
            )
        else:
            _print_error(self.output, error, self.args)
        console.print("[dim]Your message is kept: /retry resends it, /drop forgets it.[/dim]")

    def resend(self, quiet: bool = False) -> None:
        if self.kept is None:
            if not quiet:
                self._say("retry", "no message was kept")
            return
        self.send(self.kept, self.kept_turn_id)

    def summarize(self) -> None:
        if not self.conversation_id:
            self._say("summarize", "no conversation yet")
            return
        try:
            reply = self.client.summarize(
                self.conversation_id,
                window=self.args.window,
                summary_batch=self.args.summary_batch,
                max_summary_passes=self.args.summary_passes,
            )
        except RunifoldError as error:
            _print_error(self.output, error, self.args)
            return
        if self.output.json:
            self.output.message(reply)
            return
        self._say(
            "summarized",
            f"{reply.passes} pass{'' if reply.passes == 1 else 'es'}; the summary covers "
            f"1..{reply.summary.through_sequence}, {reply.backlog} older entries still wait",
        )

    def history(self, count: int) -> None:
        if not self.conversation_id:
            self._say("history", "no conversation yet")
            return
        conversation = self.client.get_conversation(self.conversation_id)
        after = max(0, conversation.last_sequence - count)
        entries = self.client.entries(self.conversation_id, after_sequence=after)
        self.output.rows("history", ("seq", "role", "text"), entries, _entry_row)

    def summary(self) -> None:
        if not self.conversation_id:
            self._say("summary", "no conversation yet")
            return
        summary = self.client.get_summary(self.conversation_id)
        if summary is None:
            self._say("summary", "none yet")
        else:
            self.output.fields("summary", summary)

    def memory(self, query: str) -> None:
        reply = self.client.search_memories(query, limit=self.args.memory or 8)
        self.output.rows(
            f"memories for {query!r}",
            ("score", "memory", "content"),
            reply.results,
            lambda hit: (f"{hit.score:.3f}", hit.memory.memory_id, hit.memory.content),
        )


def cmd_chat(args: argparse.Namespace, output: Output) -> int:
    with _client(args) as client:
        chat = Chat(args, output, client)
        try:
            return chat.run()
        except RunifoldError as error:  # a slash command's call
            _print_error(output, error, args)
            return 1


def _entry_row(entry: common_pb2.Entry) -> Sequence[str]:
    message = entry.message
    tool = ", ".join(f"{c.name}({c.id})" for c in message.tool_calls) or message.tool_call_id
    text = message.text + (f"  [{tool}]" if tool else "")
    return (str(entry.sequence), _ROLES.get(message.role, "?"), text)


def _conversation_row(conversation: Any) -> Sequence[str]:
    return (
        conversation.conversation_id,
        str(conversation.version),
        str(conversation.last_sequence),
        f"{conversation.update_time.ToDatetime():%Y-%m-%d %H:%M:%S}"
        if conversation.HasField("update_time")
        else "",
    )


def cmd_transcript(args: argparse.Namespace, output: Output) -> int:
    with _client(args) as client:
        command = args.transcript_command
        if command == "list":
            output.rows(
                f"conversations of {client.namespace}",
                ("conversation", "version", "last seq", "updated"),
                client.list_conversations(),
                _conversation_row,
            )
        elif command == "get":
            output.fields(
                f"conversation {args.conversation_id}",
                client.get_conversation(args.conversation_id),
            )
        elif command == "show":
            output.rows(
                f"conversation {args.conversation_id}",
                ("seq", "role", "text"),
                client.entries(
                    args.conversation_id,
                    after_sequence=args.after,
                    through_sequence=args.through,
                ),
                _entry_row,
            )
        elif command == "create":
            conversation = client.create_conversation(
                conversation_id=args.id, labels=_pairs(args.label, "--label")
            )
            output.fields("conversation", conversation)
        elif command == "append":
            make = {"user": user, "assistant": assistant}
            if args.role == "tool":
                if not args.tool_call_id:
                    raise UsageError("--role tool needs --tool-call-id")
                items = [tool_result(args.tool_call_id, text) for text in args.text]
            else:
                items = [make[args.role](text) for text in args.text]
            reply = client.append(
                args.conversation_id,
                items,
                expected_version=args.expected_version,
                request_id=args.request_id or None,
            )
            output.fields("appended", reply)
        elif command == "watch":
            return _watch(args, output, client)
        else:  # delete
            output.fields("deleted", client.delete_conversation(args.conversation_id))
    return 0


_FINISHES = {1: "committed", 2: "ended", 3: "released", 4: "lapsed"}


def _watch(args: argparse.Namespace, output: Output, client: Client) -> int:
    """Follow a conversation like `tail -f`: entries as they commit, turns beside them;
    resumes by itself when the stream breaks. Ends when the conversation is erased."""
    heartbeats = args.heartbeats
    for event in client.watch_conversation(
        args.conversation_id,
        after_sequence=args.after,
        heartbeat_interval=args.heartbeat or None,
    ):
        kind = event.WhichOneof("event")
        if output.json:
            if kind != "heartbeat" or heartbeats:
                output.message(event)
            continue
        if kind == "appended":
            for entry in event.appended.entries:
                sequence, role, text = _entry_row(entry)
                output.console.print(f"{sequence:>6} {role:<9} {escape(text)}")
        elif kind == "retracted":
            gone = ", ".join(str(sequence) for sequence in event.retracted.sequences)
            output.line(f"[dim]       retracted {gone} at version {event.retracted.version}[/dim]")
        elif kind == "turn_started":
            output.line(f"[dim]       turn {escape(event.turn_started.turn_id)} started[/dim]")
        elif kind == "turn_finished":
            done = event.turn_finished
            how = _FINISHES.get(done.finish, "finished while the stream was down")
            detail = f" at version {done.version}" if done.version else ""
            detail += f" ({done.reason})" if done.reason else ""
            output.line(f"[dim]       turn {escape(done.turn_id)} {how}{escape(detail)}[/dim]")
        elif kind == "heartbeat" and heartbeats:
            beat = event.heartbeat
            output.line(
                f"[dim]       caught up: version {beat.version}, last {beat.last_sequence}[/dim]"
            )
        elif kind == "erased":
            output.line("[bold]the conversation was erased[/bold]")
    return 0


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


def _memory_row(memory: Any) -> Sequence[str]:
    sources = ", ".join(
        f"{s.conversation_id[:8]}…:{s.from_sequence}..{s.through_sequence}" for s in memory.sources
    )
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
        except (EOFError, KeyboardInterrupt):
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


def cmd_memory(args: argparse.Namespace, output: Output) -> int:
    with _client(args) as client:
        command = args.memory_command
        if command == "propose":
            return cmd_memory_propose(args, output, client)
        if command == "add":
            memory = client.remember(
                args.content,
                conversation_id=args.conversation,
                from_sequence=args.from_sequence,
                through_sequence=args.through_sequence,
                metadata=_pairs(args.metadata, "--metadata"),
            )
            output.fields("remembered", memory)
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
            count = client.forget_source(
                args.conversation,
                from_sequence=args.from_sequence,
                through_sequence=args.through_sequence,
            )
            if output.json:
                output.document({"deleted_count": count})
            else:
                output.line(f"forgot {count} memories")
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


def cmd_erase(args: argparse.Namespace, output: Output) -> int:
    with _client(args) as client:
        output.fields(
            f"erased {args.conversation_id}", client.erase_conversation(args.conversation_id)
        )
    return 0


# -- the parser ------------------------------------------------------------------------


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


def _turn_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("turn")
    group.add_argument(
        "--conversation",
        "-c",
        default="",
        metavar="ID",
        help="continue this conversation (default: a new one)",
    )
    group.add_argument(
        "--window",
        type=int,
        default=16,
        metavar="N",
        help="recent entries given to the model (1..4096)",
    )
    group.add_argument(
        "--summary-batch",
        type=int,
        default=64,
        metavar="N",
        help="entries summarized per pass (1..4096)",
    )
    group.add_argument(
        "--memory",
        type=int,
        default=8,
        metavar="N",
        help="memories retrieved per turn (0: semantic memory off; at most 256)",
    )
    group.add_argument(
        "--auto-summary",
        type=int,
        default=0,
        metavar="PASSES",
        help="summarize within the turn, in at most PASSES passes, when older entries wait "
        "(0: refuse with SUMMARY_REQUIRED and enqueue a background job)",
    )
    group.add_argument(
        "--system",
        default="",
        metavar="TEXT",
        help="system instructions for the model (never stored)",
    )


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


def parser() -> argparse.ArgumentParser:
    """The argument parser of the command."""
    common = [_connection()]
    root = argparse.ArgumentParser(
        prog="runifold",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=f"{EXAMPLES}\n\n{ENVIRONMENT}",
        formatter_class=Formatter,
    )
    root.add_argument(
        "--version", action="version", version=f"runifold {runifold_client.__version__}"
    )
    root.set_defaults(group=root)
    commands = root.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    chat = _add(commands, "chat", "an interactive conversation, one turn per line", common)
    _turn_options(chat)
    chat.add_argument(
        "--summary-passes",
        type=int,
        default=8,
        metavar="N",
        help="passes of /summarize (and of the offer after SUMMARY_REQUIRED)",
    )
    chat.set_defaults(handler=cmd_chat)
    chat.epilog = f"chat commands:\n{_indent(CHAT_COMMANDS)}\n\n{ENVIRONMENT}"

    turn = _add(commands, "turn", "run one agent turn and print the answer", common)
    turn.add_argument("text", help="the user's message")
    _turn_options(turn)
    turn.add_argument(
        "--concurrency",
        choices=sorted(_CONCURRENCY),
        default="race",
        help="how the turn shares the conversation with other turns",
    )
    turn.add_argument(
        "--turn-id", default="", metavar="ID", help="idempotency key (default: a new UUID)"
    )
    turn.add_argument("--stream", action="store_true", help="print the answer as it is generated")
    turn.set_defaults(handler=cmd_turn)

    _, transcript = _group(
        commands, "transcript", "conversations and their entries", "transcript_command"
    )
    _add(transcript, "list", "list the conversations of the namespace", common)
    get = _add(transcript, "get", "a conversation's version and counters", common)
    get.add_argument("conversation_id", metavar="ID", help="the conversation's id (a UUID)")
    show = _add(transcript, "show", "print a conversation's entries", common)
    show.add_argument("conversation_id", metavar="ID", help="the conversation's id (a UUID)")
    show.add_argument(
        "--after", type=int, default=0, metavar="SEQ", help="only entries after this sequence"
    )
    show.add_argument(
        "--through",
        type=int,
        default=0,
        metavar="SEQ",
        help="only entries up to this sequence (0: to the end)",
    )
    create = _add(transcript, "create", "create a conversation", common)
    create.add_argument(
        "--id", default="", metavar="ID", help="its id, a UUID (default: a new UUIDv7)"
    )
    create.add_argument(
        "--label", action="append", metavar="KEY=VALUE", help="a label (repeatable)"
    )
    append = _add(transcript, "append", "append messages to a conversation", common)
    append.add_argument("conversation_id", metavar="ID", help="the conversation's id (a UUID)")
    append.add_argument("text", nargs="+", help="one message per argument")
    append.add_argument(
        "--role", choices=["user", "assistant", "tool"], default="user", help="who said them"
    )
    append.add_argument(
        "--tool-call-id", default="", metavar="ID", help="the tool call a tool message answers"
    )
    append.add_argument(
        "--expected-version",
        type=int,
        metavar="N",
        help="append only at this version (compare-and-swap; default: any)",
    )
    append.add_argument(
        "--request-id", default="", metavar="ID", help="idempotency key (default: a new UUID)"
    )
    watch = _add(
        transcript,
        "watch",
        "follow a conversation like tail -f: entries as they commit, and its turns",
        common,
    )
    watch.add_argument("conversation_id", metavar="ID", help="the conversation's id (a UUID)")
    watch.add_argument(
        "--after",
        type=int,
        default=0,
        metavar="SEQ",
        help="start after this sequence (0: replay every entry first)",
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
    delete = _add(transcript, "delete", "delete a transcript (see also: erase)", common)
    delete.add_argument("conversation_id", metavar="ID", help="the conversation's id (a UUID)")
    for choice in transcript.choices.values():
        choice.set_defaults(handler=cmd_transcript)

    _, summary = _group(
        commands, "summary", "summaries of old transcript entries", "summary_command"
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

    _, memory = _group(commands, "memory", "curated semantic memory", "memory_command")
    add = _add(memory, "add", "curate a fact from a transcript range", common)
    add.add_argument("content", help="the fact")
    add.add_argument(
        "--conversation", "-c", required=True, metavar="ID", help="the source conversation"
    )
    add.add_argument(
        "--from",
        dest="from_sequence",
        type=int,
        required=True,
        metavar="SEQ",
        help="first sequence of the source range",
    )
    add.add_argument(
        "--through",
        dest="through_sequence",
        type=int,
        required=True,
        metavar="SEQ",
        help="last sequence of the source range",
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
    forget = _add(memory, "forget", "delete what was derived from a conversation", common)
    forget.add_argument(
        "--conversation", "-c", required=True, metavar="ID", help="the source conversation"
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
    for choice in memory.choices.values():
        choice.set_defaults(handler=cmd_memory)

    backlog = _add(commands, "backlog", "the summary job queue of the namespace", common)
    backlog.set_defaults(handler=cmd_backlog)
    erase = _add(
        commands,
        "erase",
        "erase a conversation everywhere: entries, summaries, derived memories",
        common,
    )
    erase.add_argument("conversation_id", metavar="ID", help="the conversation's id")
    erase.set_defaults(handler=cmd_erase)
    return root


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


def _usage_error(message: str) -> NoReturn:
    print(f"runifold: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `runifold` command."""
    args = parser().parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:  # a bare command or group: its help
        args.group.print_help()
        return 0
    output = Output(json=args.json, console=Console(highlight=False))
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
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
