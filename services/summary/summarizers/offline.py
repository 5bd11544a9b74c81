"""The offline summarizer: a deterministic digest, no network (the embedded default's and
the tests'). It reads back the digests it wrote, so a conversation's summary stays a
digest of everything so far."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.common.domain import Entry, Role, Usage
from services.llm import metrics
from services.llm.model import estimate_tokens
from services.summary.summarizers.prompt import (
    PromptBuilder,
    SummaryOutput,
    SummaryPrompt,
    role_name,
)

_HEADER = re.compile(
    r"Conversation summary through entry (\d+) \(offline digest\)\.\n"
    r"Counted: (\d+) user messages, (\d+) assistant messages, (\d+) tool results\.\n"
)
_TOOLS = re.compile(r"Tools called: (.*)\.\n")
_TOOL_COUNT = re.compile(r"(.+) \((\d+)\)")
_EXCERPT_CHARS = 160
_OPENING_LINES = 4
_TOOLS_SHOWN = 10
_EARLIER_CHARS = 400


@dataclass
class _Digest:
    through: int = 0
    users: int = 0
    assistants: int = 0
    tool_results: int = 0
    tools: Counter[str] = field(default_factory=Counter)
    earlier: str = ""
    opening: list[str] = field(default_factory=list)
    recent: list[str] = field(default_factory=list)

    def render(self) -> str:
        parts = [
            f"Conversation summary through entry {self.through} (offline digest).\n"
            f"Counted: {self.users} user messages, {self.assistants} assistant messages, "
            f"{self.tool_results} tool results.\n"
        ]
        if self.tools:
            shown = sorted(self.tools.items(), key=lambda kv: (-kv[1], kv[0]))[:_TOOLS_SHOWN]
            parts.append("Tools called: " + ", ".join(f"{n} ({c})" for n, c in shown) + ".\n")
        if self.earlier:
            parts.append(f"Earlier summary (excerpt): {self.earlier}\n")
        if self.opening:
            parts.append("Opening:\n" + "".join(f"{line}\n" for line in self.opening))
        if self.recent:
            parts.append("Recent:\n" + "".join(f"{line}\n" for line in self.recent))
        return "".join(parts).rstrip("\n")


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _EXCERPT_CHARS else flat[: _EXCERPT_CHARS - 3].rstrip() + "..."


def _parse(previous: str) -> _Digest:
    """Read back a digest this summarizer wrote; anything else becomes an excerpt."""
    digest = _Digest()
    header = _HEADER.match(previous)
    if header is None:
        digest.earlier = _excerpt(previous)[:_EARLIER_CHARS]
        return digest
    digest.through, digest.users, digest.assistants, digest.tool_results = map(int, header.groups())
    rest = previous[header.end() :]
    tools = _TOOLS.match(rest)
    if tools:
        for item in tools.group(1).split(", "):
            match = _TOOL_COUNT.fullmatch(item)
            if match:
                digest.tools[match.group(1)] = int(match.group(2))
        rest = rest[tools.end() :]
    section: list[str] | None = None
    for line in rest.split("\n"):
        if line.startswith("Earlier summary (excerpt): "):
            digest.earlier = line.removeprefix("Earlier summary (excerpt): ")
        elif line == "Opening:":
            section = digest.opening
        elif line == "Recent:":
            section = digest.recent
        elif line.startswith("- [") and section is not None:
            section.append(line)
    return digest


def _entry_line(entry: Entry) -> str:
    message = entry.message
    if message.role == Role.TOOL:
        return f"- [{entry.sequence}] tool result: {_excerpt(message.text)}"
    if message.tool_calls:
        names = ", ".join(call.name for call in message.tool_calls)
        said = f": {_excerpt(message.text)}" if message.text.strip() else ""
        return f"- [{entry.sequence}] assistant called {names}{said}"
    return f"- [{entry.sequence}] {role_name(message.role)}: {_excerpt(message.text)}"


def offline_digest(previous: str | None, entries: Sequence[Entry], target_bytes: int) -> str:
    """A deterministic, readable digest of the previous digest plus the entries.

    Keeps counts, the tools used, the first lines of the conversation and as many of the
    most recent lines as fit in `target_bytes` (UTF-8); the result never
    exceeds it.
    """
    digest = _parse(previous) if previous else _Digest()
    for entry in entries:
        message = entry.message
        digest.through = max(digest.through, entry.sequence)
        if message.role == Role.USER:
            digest.users += 1
        elif message.role == Role.ASSISTANT:
            digest.assistants += 1
            digest.tools.update(call.name for call in message.tool_calls)
        elif message.role == Role.TOOL:
            digest.tool_results += 1
        line = _entry_line(entry)
        # The first lines say what the conversation is about: they stay; the rest
        # is a rolling window of the most recent lines.
        if len(digest.opening) < _OPENING_LINES and not digest.recent:
            digest.opening.append(line)
        else:
            digest.recent.append(line)
    text = digest.render()
    while len(text.encode()) > target_bytes and digest.recent:
        # Drop the oldest recent lines, many at a time when far over the target.
        over = len(text.encode()) - target_bytes
        drop = max(1, min(len(digest.recent), over // 200))
        del digest.recent[:drop]
        text = digest.render()
    encoded = text.encode()
    if len(encoded) > target_bytes:
        text = encoded[:target_bytes].decode("utf-8", "ignore")
    return text


# The offline digest stays small whatever the byte limit: it is a stand-in for a model.
OFFLINE_TARGET_BYTES = 4096


class OfflineSummarizer(PromptBuilder):
    """The deterministic summarizer of the embedded default and the tests: no network."""

    provider = "offline"

    def __init__(
        self, *, max_entry_chars: int = 4000, target_bytes: int = OFFLINE_TARGET_BYTES
    ) -> None:
        self.max_entry_chars = max_entry_chars
        self.max_summary_bytes = target_bytes  # the prompt's bound, and the digest's
        self._seconds = metrics.MODEL_SECONDS.labels("summary", "offline")
        self._tokens_in = metrics.MODEL_TOKENS.labels("summary", "offline", "input")
        self._tokens_out = metrics.MODEL_TOKENS.labels("summary", "offline", "output")

    async def summarize(self, prompt: SummaryPrompt, *, timeout: float) -> SummaryOutput:
        started = time.perf_counter()
        # The digest honours the output budget like a model would (4 bytes a token).
        target = max(64, min(self.max_summary_bytes, prompt.max_output_tokens * 4))
        text = offline_digest(prompt.previous, prompt.entries, target)
        usage = Usage(prompt.input_tokens, estimate_tokens(text), 1)
        self._seconds.observe(time.perf_counter() - started)
        self._tokens_in.inc(usage.input_tokens)
        self._tokens_out.inc(usage.output_tokens)
        return SummaryOutput(text, usage)
