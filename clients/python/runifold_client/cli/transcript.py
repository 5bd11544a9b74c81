"""`runifold transcript ...`: conversations and their entries (list, get, show, create,
append, watch, fork, verify, export, delete), erasure everywhere and its receipt (erase,
receipt), and `runifold erase`: the same erasure."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from google.protobuf.json_format import ParseDict
from rich.markup import escape

from runifold.common.v1 import common_pb2
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client.cli.options import _add, _client, _group, _pairs
from runifold_client.cli.output import Output, UsageError, plain
from runifold_client.client import Client
from runifold_client.digests import VerificationFailed, Verified, recompute
from runifold_client.policy import assistant, tool_result, user

_ROLES = {
    value: name.removeprefix("ROLE_").lower()
    for name, value in common_pb2.Role.items()
    if value != common_pb2.ROLE_UNSPECIFIED
}


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
    if args.transcript_command == "verify" and args.file:
        # An export, offline: no server.
        with open(args.file, encoding="utf-8") as lines:
            return _verified(output, args.file, lambda: verify_export(lines))
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
        elif command == "fork":
            fork = client.fork_conversation(
                args.conversation_id,
                args.through,
                new_conversation_id=args.id,
                request_id=args.request_id or None,
            )
            output.fields("fork", fork)
        elif command == "verify":
            if not args.conversation_id:
                raise UsageError("verify needs the conversation's ID (or --file FILE)")
            return _verified(
                output,
                args.conversation_id,
                lambda: client.verify_conversation(
                    args.conversation_id, head_digest=bytes.fromhex(args.head)
                ),
            )
        elif command == "export":
            if not args.output:
                export(client, args.conversation_id, sys.stdout)
            else:
                with open(args.output, "w", encoding="utf-8") as out:
                    export(client, args.conversation_id, out)
        else:  # delete
            output.fields("deleted", client.delete_conversation(args.conversation_id))
    return 0


def _verified(output: Output, name: str, verify: Any) -> int:
    """Run a verification and say how it ended (exit status 1 when it failed)."""
    try:
        verified: Verified = verify()
    except VerificationFailed as failed:
        if output.json:
            output.document({"verified": False, "version": failed.version, "why": failed.why})
        else:
            output.console.print(
                f"[bold red]NOT VERIFIED[/bold red] {escape(name)}: at version "
                f"{failed.version}, {escape(failed.why)}"
            )
        return 1
    if output.json:
        output.document(
            {
                "verified": True,
                "head_digest": verified.head_digest.hex(),
                "appends": verified.appends,
                "entries": verified.entries,
            }
        )
    else:
        output.console.print(
            f"[bold green]verified[/bold green] {escape(name)}: {verified.appends} appends, "
            f"{verified.entries} entries, head digest {verified.head_digest.hex()}"
        )
    return 0


def export(client: Client, conversation_id: str, out: TextIO) -> None:
    """A conversation as JSON Lines that verify offline (`runifold transcript verify
    --file`): the conversation, then its appends in version order, then its entries in
    sequence order, one {"conversation" | "append" | "entry": ...} document a line (proto
    field names; bytes in base64)."""
    conversation = client.get_conversation(conversation_id)
    out.write(json.dumps({"conversation": plain(conversation)}, ensure_ascii=False) + "\n")
    last = 0
    for append in client.appends(conversation_id):
        if append.version > conversation.version:
            break
        last = append.last_sequence
        out.write(json.dumps({"append": plain(append)}, ensure_ascii=False) + "\n")
    for entry in client.entries(conversation_id, through_sequence=last):
        if entry.sequence > last:
            break
        out.write(json.dumps({"entry": plain(entry)}, ensure_ascii=False) + "\n")


def _documents(lines: TextIO) -> Iterator[dict[str, Any]]:
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                yield json.loads(line)
            except ValueError as error:
                raise UsageError(f"line {number} of the export is not JSON: {error}") from None


def verify_export(lines: TextIO) -> Verified:
    """Verify an export (`export`) offline: recompute its chain and compare it with the
    head digest it names. Give the head digest you hold to trust nothing in the file."""
    head = b""
    appends: list[transcript_pb.Append] = []
    entries: dict[int, common_pb2.Entry] = {}
    for document in _documents(lines):
        if "conversation" in document:
            head = ParseDict(document["conversation"], transcript_pb.Conversation()).head_digest
        elif "append" in document:
            appends.append(ParseDict(document["append"], transcript_pb.Append()))
        elif "entry" in document:
            entry = ParseDict(document["entry"], common_pb2.Entry())
            entries[entry.sequence] = entry
    return recompute(appends, entries, head)


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


def _receipt(output: Output, receipt: Any) -> None:
    """An erasure receipt: counts per store; whether the index has caught up yet."""
    pending = ", ".join(receipt.remaining)
    title = f"erasure receipt {receipt.receipt_id}" + (
        f" (not complete: {pending} remaining; ask again with `runifold transcript receipt "
        f"{receipt.receipt_id}`)"
        if not receipt.HasField("complete_time")
        else ""
    )
    output.fields(title, receipt)


def cmd_erase(args: argparse.Namespace, output: Output) -> int:
    with _client(args) as client:
        reply = client.erase_conversation(args.conversation_id)
    if output.json:
        output.message(reply)
        return 0
    erased = type(reply)()
    erased.CopyFrom(reply)
    erased.ClearField("receipt")
    output.fields(f"erased {args.conversation_id}", erased)
    if reply.HasField("receipt"):
        _receipt(output, reply.receipt)
    return 0


def cmd_receipt(args: argparse.Namespace, output: Output) -> int:
    if bool(args.receipt_id) == bool(args.conversation):
        raise UsageError("give a receipt id, or --conversation ID (its latest receipt)")
    with _client(args) as client:
        receipt = client.erasure_receipt(args.receipt_id, conversation_id=args.conversation)
    if output.json:
        output.message(receipt)
    else:
        _receipt(output, receipt)
    return 0


def add_parser(commands: Any, common: Sequence[argparse.ArgumentParser]) -> None:
    """The `transcript` group."""
    _, transcript = _group(
        commands, "transcript", "conversations and their entries", "transcript_command", common
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
    fork = _add(
        transcript,
        "fork",
        "a new conversation from the entries 1..SEQ of another, sharing them (edit and regenerate)",
        common,
    )
    fork.add_argument("conversation_id", metavar="ID", help="the source's id (a UUID)")
    fork.add_argument(
        "--through", type=int, required=True, metavar="SEQ", help="the last entry it shares"
    )
    fork.add_argument("--id", default="", metavar="ID", help="the fork's id (default: a UUIDv7)")
    fork.add_argument(
        "--request-id", default="", metavar="ID", help="idempotency key (default: a new UUID)"
    )
    verify = _add(
        transcript,
        "verify",
        "recompute a conversation's digest chain and compare it with its head digest "
        "(exit status 1 when it does not hold)",
        common,
    )
    verify.add_argument(
        "conversation_id", metavar="ID", nargs="?", default="", help="the conversation's id"
    )
    verify.add_argument(
        "--head",
        default="",
        metavar="HEX",
        help="the head digest you hold (default: the server's)",
    )
    verify.add_argument(
        "--file", default="", metavar="FILE", help="verify an export offline instead"
    )
    export_parser = _add(
        transcript,
        "export",
        "write a conversation as JSON Lines that `verify --file` checks offline",
        common,
    )
    export_parser.add_argument("conversation_id", metavar="ID", help="the conversation's id")
    export_parser.add_argument(
        "--output", default="", metavar="FILE", help="where to write it (none: the standard output)"
    )
    delete = _add(transcript, "delete", "delete a transcript (see also: erase)", common)
    delete.add_argument("conversation_id", metavar="ID", help="the conversation's id (a UUID)")
    for choice in transcript.choices.values():
        choice.set_defaults(handler=cmd_transcript)
    erase = _add(
        transcript,
        "erase",
        "erase a conversation everywhere (entries, summaries, derived memories); prints the "
        "receipt",
        common,
    )
    erase.add_argument("conversation_id", metavar="ID", help="the conversation's id")
    erase.set_defaults(handler=cmd_erase)
    receipt = _add(
        transcript, "receipt", "an erasure's receipt: what was erased, store by store", common
    )
    receipt.add_argument("receipt_id", metavar="ID", nargs="?", default="", help="the receipt's id")
    receipt.add_argument(
        "--conversation",
        "-c",
        default="",
        metavar="ID",
        help="instead of an id: the latest receipt of this conversation",
    )
    receipt.set_defaults(handler=cmd_receipt)


def add_erase_parser(commands: Any, common: Sequence[argparse.ArgumentParser]) -> None:
    """The `erase` command."""
    erase = _add(
        commands,
        "erase",
        "erase a conversation everywhere: entries, summaries, derived memories; prints the receipt",
        common,
    )
    erase.add_argument("conversation_id", metavar="ID", help="the conversation's id")
    erase.set_defaults(handler=cmd_erase)
