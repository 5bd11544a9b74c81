"""Domain types shared by the services: messages, entries, usage, budgets.

These mirror `runifold.common.v1` without depending on protobuf, so the domain
layer of each service can be tested and reasoned about on its own.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Any

from services.common.errors import invalid_argument

# Above every sequence a transcript can reach, and below int64 overflow when a batch
# is added to it: the open upper bound of a sequence range ("to the end").
SEQUENCE_MAX = 2**62


class Role(enum.IntEnum):
    """Who said a message. Values equal the protobuf enum's."""

    USER = 1
    ASSISTANT = 2
    TOOL = 3
    SYSTEM = 4


_EMPTY: Mapping[str, str] = MappingProxyType({})


def _frozen_map(values: Mapping[str, str] | None) -> Mapping[str, str]:
    return MappingProxyType(dict(values)) if values else _EMPTY


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool invocation requested by the assistant."""

    id: str
    name: str
    arguments_json: str = ""


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    """A tool the model may call; it runs on the client."""

    name: str
    description: str = ""
    parameters_json_schema: str = ""


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a conversation."""

    role: Role
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    metadata: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    # The writer's own representation (a JSON document kept verbatim); never read here.
    native_json: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.metadata, MappingProxyType):
            object.__setattr__(self, "metadata", _frozen_map(self.metadata))

    def canonical(self) -> dict[str, object]:
        """A JSON-ready form with a stable key order, for hashing and storage.

        `native_json` only when set: the digests of messages without one stay what
        they were before the field existed (recorded request ids still replay).
        """
        form: dict[str, object] = {
            "role": int(self.role),
            "text": self.text,
            "tool_calls": [[c.id, c.name, c.arguments_json] for c in self.tool_calls],
            "tool_call_id": self.tool_call_id,
            "metadata": dict(sorted(self.metadata.items())),
        }
        if self.native_json:
            form["native_json"] = self.native_json
        return form

    @classmethod
    def from_canonical(cls, value: Mapping[str, Any]) -> Message:
        """The message of a `canonical()` form (read back from storage)."""
        return cls(
            role=Role(value["role"]),
            text=value.get("text", ""),
            tool_calls=tuple(ToolCall(*call) for call in value.get("tool_calls") or ()),
            tool_call_id=value.get("tool_call_id") or "",
            metadata=value.get("metadata") or {},
            native_json=value.get("native_json") or "",
        )

    def size_bytes(self) -> int:
        """UTF-8 size of everything the message carries."""
        size = len(self.text.encode()) + len(self.tool_call_id.encode())
        size += len(self.native_json.encode())
        for call in self.tool_calls:
            size += len(call.id.encode()) + len(call.name.encode())
            size += len(call.arguments_json.encode())
        for key, value in self.metadata.items():
            size += len(key.encode()) + len(value.encode())
        return size


def canonical_json(messages: Iterable[Message]) -> str:
    """Messages as one canonical JSON array (stable key order, compact)."""
    return json.dumps([m.canonical() for m in messages], separators=(",", ":"), ensure_ascii=False)


def payload_hash(canonical: str) -> bytes:
    """A digest of messages' canonical JSON, to tell a replay from a reused id."""
    return hashlib.sha256(canonical.encode()).digest()


def open_tool_calls(tail: Sequence[Message]) -> set[str] | None:
    """The unanswered tool calls at the end of a transcript (its last messages, in order).

    None when the transcript does not end inside a tool call group.
    """
    answered: set[str] = set()
    for message in reversed(tail):
        if message.role == Role.TOOL:
            answered.add(message.tool_call_id)
            continue
        if message.role == Role.ASSISTANT and message.tool_calls:
            return {call.id for call in message.tool_calls} - answered
        break
    return None


def check_tool_pairing(
    messages: Sequence[Message], open_calls: set[str] | None, field: str = "messages"
) -> None:
    """Every tool result answers an unanswered call of the assistant message before it.

    `open_calls` are the unanswered calls at the transcript's tail (None when
    the tail is not inside a tool call group). Raises INVALID_ARGUMENT /
    ORPHANED_TOOL_RESULT naming the first offending message.
    """
    pending = None if open_calls is None else set(open_calls)
    for index, message in enumerate(messages):
        if message.role == Role.TOOL:
            if pending is None or message.tool_call_id not in pending:
                raise invalid_argument(
                    "ORPHANED_TOOL_RESULT",
                    "a tool result must answer an unanswered tool call of the assistant "
                    "message right before it",
                    field=f"{field}[{index}].tool_call_id",
                )
            pending.discard(message.tool_call_id)
        elif message.role == Role.ASSISTANT and message.tool_calls:
            pending = {call.id for call in message.tool_calls}
        else:
            pending = None


@dataclass(frozen=True, slots=True)
class Entry:
    """A message as stored at a sequence of a transcript."""

    sequence: int
    message: Message
    created_at: datetime
    # The version of the write that retracted it (0: it stands), and when.
    retracted_version: int = 0
    retract_time: datetime | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """Resources consumed by model calls."""

    input_tokens: int = 0
    output_tokens: int = 0
    model_calls: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.model_calls + other.model_calls,
        )


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits on what a request may consume; zero fields take server defaults."""

    max_output_tokens: int = 0
    max_model_calls: int = 0
    max_input_tokens: int = 0
