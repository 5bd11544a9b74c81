"""`runifold turn`: run one agent turn and print the answer (whole, or as it is generated)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from rich.markup import escape

from runifold_client.cli.options import _add, _client
from runifold_client.cli.output import Output, UsageError
from runifold_client.client import ConcurrencyMode, TurnResult
from runifold_client.policy import ConversationContextPolicy

_CONCURRENCY = {
    "race": ConcurrencyMode.RACE,
    "reject": ConcurrencyMode.REJECT,
    "enqueue": ConcurrencyMode.ENQUEUE,
}


# A turn's defaults are the client's (ConversationContextPolicy), so that the CLI and a
# program written against the client behave alike.
_DEFAULT = ConversationContextPolicy()


def _policy(args: argparse.Namespace) -> ConversationContextPolicy:
    policy = ConversationContextPolicy(window=args.window, summary_batch=args.summary_batch)
    if args.memory:
        policy = policy.with_semantic_memory(args.memory)
    if args.auto_summary:
        policy = policy.with_auto_summary(args.auto_summary)
    else:
        policy = policy.with_summary_required()
    return policy


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
        default=_DEFAULT.window,
        metavar="N",
        help="recent entries given to the model (1..4096)",
    )
    group.add_argument(
        "--summary-batch",
        type=int,
        default=_DEFAULT.summary_batch,
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
        default=_DEFAULT.max_summary_passes if _DEFAULT.summary_mode == "auto" else 0,
        metavar="PASSES",
        help="summarize within the turn, in at most PASSES passes, when older entries wait "
        "because the background queue has not summarized them yet (0: refuse with "
        "SUMMARY_REQUIRED and enqueue a background job instead)",
    )
    group.add_argument(
        "--system",
        default="",
        metavar="TEXT",
        help="system instructions for the model (never stored)",
    )


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


def _text(argument: str) -> str:
    """The message: the argument, or with `-` what stdin holds (without its final
    newlines), as `cat -` reads it."""
    if argument != "-":
        return argument
    text = sys.stdin.read().rstrip("\r\n")
    if not text.strip():
        raise UsageError("no message on stdin (`runifold turn -` reads it from there)")
    return text


def cmd_turn(args: argparse.Namespace, output: Output) -> int:
    text = _text(args.text)
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
            for event in client.stream_conversation(text, **options):
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
        result = client.run_conversation(text, **options)
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


def add_parser(commands: Any, common: Sequence[argparse.ArgumentParser]) -> None:
    """The `turn` command."""
    turn = _add(commands, "turn", "run one agent turn and print the answer", common)
    turn.add_argument("text", help="the user's message (-: read it from stdin)")
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
