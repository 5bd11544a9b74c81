"""`runifold chat`: an interactive conversation, one turn per line; slash commands run here.

At a terminal it reads lines with GNU readline (or libedit): line editing, and a history
that Up and Down walk, kept between sessions in the user's data folder (`history_path`).
Before the first message it checks that the server answers, so a wrong address, token
or namespace is said at once with what fixes it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from rich.markup import escape

from runifold_client.cli.options import ENVIRONMENT, _add, _client, _indent
from runifold_client.cli.output import Output, _error_document, _print_error
from runifold_client.cli.transcript import _entry_row
from runifold_client.cli.turn import _policy, _status_line, _turn_options
from runifold_client.client import Client
from runifold_client.errors import ModelOutputInvalid, RunifoldError, SummaryRequired, TurnConflict

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
A line that starts with // sends the rest of it, slash included.
Up and Down walk the history of earlier lines; Ctrl-C leaves at once (status 130)."""

# Lines the history file keeps (the newest).
HISTORY_LINES = 1000
HISTORY = """\
history:
  At a terminal, the lines typed are kept in $XDG_DATA_HOME/runifold/chat_history
  (~/.local/share/runifold/chat_history when XDG_DATA_HOME is not set; on Windows
  %LOCALAPPDATA%\\runifold\\chat_history): the last 1000, readable by you alone.
  Delete the file to forget them."""


def history_path() -> Path:
    """Where `runifold chat` keeps the lines typed at a terminal: the user's data folder
    ($XDG_DATA_HOME, else ~/.local/share; %LOCALAPPDATA% on Windows), runifold/chat_history."""
    if os.name == "nt" and os.environ.get("LOCALAPPDATA"):
        base = Path(os.environ["LOCALAPPDATA"])
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "runifold" / "chat_history"


def _readline() -> ModuleType | None:
    """The readline module (line editing and history for input()), where there is one."""
    try:
        import readline
    except ImportError:  # Windows without pyreadline: plain input()
        return None
    return readline


class _History:
    """The history of the lines typed at a terminal, read at the start and written back
    at the end (Ctrl-C included), the last HISTORY_LINES, mode 0600: they are messages."""

    def __init__(self, readline: ModuleType, path: Path) -> None:
        self.readline = readline
        self.path = path

    def __enter__(self) -> _History:
        self.readline.set_history_length(HISTORY_LINES)
        with contextlib.suppress(OSError):
            self.readline.read_history_file(self.path)
        return self

    def __exit__(self, *_: object) -> None:
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch(mode=0o600, exist_ok=True)
            self.readline.write_history_file(self.path)


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

    def interactive(self) -> bool:
        """Whether a person types the lines (a terminal, not --json): then readline reads."""
        return not self.output.json and sys.stdin.isatty()

    def prompt(self) -> str:
        """The prompt, coloured when the console is; readline is told (between \\001 and
        \\002) which characters take no room, so that editing redraws the line right."""
        console = self.output.console
        if console.color_system is None or not console.is_terminal:
            return "you> "
        return "\001\x1b[32m\002you>\001\x1b[0m\002 "

    def lines(self) -> Iterator[str]:
        """The lines typed, until Ctrl-D (end of input). Ctrl-C is raised: it leaves."""
        while True:
            if self.interactive():
                try:
                    line = input(self.prompt())
                except EOFError:
                    self.output.console.print()
                    return
                except KeyboardInterrupt:
                    self.output.console.print()  # the shell's prompt on a line of its own
                    raise
            else:
                line = sys.stdin.readline()
                if not line:
                    return
                if not self.output.json:
                    self.output.console.print(f"[green]you>[/green] {escape(line.rstrip())}")
            yield line.rstrip("\n")

    def check(self) -> None:
        """Before the first message: the server answers, the token and the namespace are
        good (a read of the namespace's summary backlog); raises what is wrong."""
        self.client.backlog()

    def run(self) -> int:
        self.check()
        where = f"namespace {self.client.namespace or '(from the token)'} at {self.client.target}"
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
        readline = _readline() if chat.interactive() else None
        history = (
            _History(readline, history_path()) if readline is not None else contextlib.nullcontext()
        )
        with history:
            try:
                return chat.run()
            except RunifoldError as error:  # the check at the start, a slash command's call
                _print_error(output, error, args)
                return 1


def add_parser(commands: Any, common: Sequence[argparse.ArgumentParser]) -> None:
    """The `chat` command."""
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
    chat.epilog = f"chat commands:\n{_indent(CHAT_COMMANDS)}\n\n{HISTORY}\n\n{ENVIRONMENT}"
