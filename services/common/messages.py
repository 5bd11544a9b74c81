"""The rules of the messages a transcript stores, in one place.

TranscriptService checks every append against them; AgentService checks a
turn's input before it calls the model (a message the append would refuse
must not cost a model call) and the model's reply before it appends (a reply
that breaks them is MODEL_OUTPUT_INVALID, its outcome kept). The limits come
from the same variables in every service (RUNIFOLD_MAX_*; docs/transcript.md).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from services.common import jsonb, validation
from services.common.domain import Message, Role
from services.common.errors import invalid_argument
from services.common.settings import Env, env_int

# RUNIFOLD_MAX_MESSAGE_BYTES: one message's limit.
MAX_MESSAGE_BYTES = 256 * 1024
MESSAGE_BYTES_RANGE = (1024, 8 * 1024 * 1024)
# Tool call ids and tool names as the transcript stores them.
MAX_TOOL_ID_CHARS = 128
MAX_TOOL_NAME_CHARS = 128

# Protobuf framing of one Message beyond the bytes `Message.size_bytes` counts, at
# most: its own tag and length, the role, the tags and lengths of text,
# tool_call_id and native_json, and of every metadata entry (tag, length, key's
# and value's).
_MESSAGE_FRAMING = 6 + 2 + 6 + 6 + 6 + validation.MAX_METADATA_ENTRIES * 8
# The same for each tool call: its tag and length, and those of id, name and arguments.
_TOOL_CALL_FRAMING = 15
# Everything else one request carries besides its messages: ids, the namespace,
# versions, usage, a fencing token (each bounded far below this).
REQUEST_FIELDS_BOUND = 4096


@dataclass(frozen=True)
class MessageLimits:
    """Explicit limits of what one append stores; each breach is INVALID_ARGUMENT."""

    max_messages_per_append: int = 256
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_append_bytes: int = 4 * 1024 * 1024
    max_tool_calls_per_message: int = 64
    # How deep a client's JSON document may nest (native_json, state, tool schemas).
    max_json_depth: int = jsonb.MAX_DEPTH

    @classmethod
    def from_env(cls, env: Env | None = None) -> MessageLimits:
        env = os.environ if env is None else env
        return cls(
            max_messages_per_append=env_int(
                env, "RUNIFOLD_MAX_MESSAGES_PER_APPEND", 256, minimum=1, maximum=4096
            ),
            max_message_bytes=env_int(
                env,
                "RUNIFOLD_MAX_MESSAGE_BYTES",
                MAX_MESSAGE_BYTES,
                minimum=MESSAGE_BYTES_RANGE[0],
                maximum=MESSAGE_BYTES_RANGE[1],
            ),
            max_append_bytes=env_int(
                env,
                "RUNIFOLD_MAX_APPEND_BYTES",
                4 * 1024 * 1024,
                minimum=1024,
                maximum=12 * 1024 * 1024,
            ),
            max_tool_calls_per_message=env_int(
                env, "RUNIFOLD_MAX_TOOL_CALLS_PER_MESSAGE", 64, minimum=1, maximum=512
            ),
            max_json_depth=env_int(
                env,
                "RUNIFOLD_MAX_JSON_DEPTH",
                jsonb.MAX_DEPTH,
                minimum=jsonb.DEPTH_RANGE[0],
                maximum=jsonb.DEPTH_RANGE[1],
            ),
        )


def messages_wire_bytes(count: int, size_bytes: int, max_tool_calls: int) -> int:
    """The most bytes `count` messages of `size_bytes` in all (as `Message.size_bytes`
    counts them, each with at most `max_tool_calls` tool calls) take on the wire."""
    return size_bytes + count * (_MESSAGE_FRAMING + max_tool_calls * _TOOL_CALL_FRAMING)


def append_request_bytes(limits: MessageLimits) -> int:
    """The size of the largest AppendEntries request the limits allow: what the
    transport must accept, and no more (services/common/server.py)."""
    return REQUEST_FIELDS_BOUND + messages_wire_bytes(
        limits.max_messages_per_append,
        limits.max_append_bytes,
        limits.max_tool_calls_per_message,
    )


def message_count(count: int, limit: int, field: str) -> None:
    """At most `limit` messages (TOO_MANY_MESSAGES): checked on the request's repeated
    field before any message is converted, so that an oversized request costs
    nothing more than its count."""
    if count > limit:
        raise invalid_argument(
            "TOO_MANY_MESSAGES",
            f"{field} carries at most {limit} messages",
            field=field,
            limit=limit,
        )


def message(
    value: Message, field: str, *, max_bytes: int, max_json_depth: int = jsonb.MAX_DEPTH
) -> int:
    """The rules of every message, whatever its role and whichever service receives it.

    No system role (SYSTEM_ROLE_NOT_ALLOWED), no NUL in the text, metadata within
    its limits, `native_json` a JSON document by jsonb's rules when set
    (INVALID_NATIVE_JSON), at most `max_bytes` in all (MESSAGE_TOO_LARGE), text in a
    user message. Returns the message's size in bytes.
    """
    if value.role == Role.SYSTEM:
        raise invalid_argument(
            "SYSTEM_ROLE_NOT_ALLOWED",
            "system messages are never persisted; send system instructions per request",
            field=f"{field}.role",
        )
    if "\x00" in value.text:
        raise invalid_argument(
            "INVALID_MESSAGE", "text must not contain NUL characters", field=f"{field}.text"
        )
    validation.metadata(value.metadata, f"{field}.metadata")
    if value.native_json:
        validation.json_document(
            value.native_json,
            f"{field}.native_json",
            "INVALID_NATIVE_JSON",
            max_depth=max_json_depth,
        )
    size = value.size_bytes()
    if size > max_bytes:
        raise invalid_argument(
            "MESSAGE_TOO_LARGE",
            f"{field} exceeds {max_bytes} bytes",
            field=field,
            limit_bytes=max_bytes,
        )
    if value.role == Role.USER and not value.text.strip():
        raise invalid_argument(
            "INVALID_MESSAGE", f"{field}.text must not be empty", field=f"{field}.text"
        )
    return size


def kept_message(value: Message, field: str, *, max_json_depth: int = jsonb.MAX_DEPTH) -> None:
    """What a message kept outside the transcript must be even when it breaks the
    transcript's rules (the outcome of a turn that ended without committing, a
    MODEL_OUTPUT_INVALID reply among them): strings PostgreSQL can store, no NUL
    (INVALID_OUTCOME), and `native_json` by jsonb's rules (INVALID_NATIVE_JSON)."""
    strings = [(value.text, "text"), (value.tool_call_id, "tool_call_id")]
    for index, call in enumerate(value.tool_calls):
        strings += [
            (call.id, f"tool_calls[{index}].id"),
            (call.name, f"tool_calls[{index}].name"),
            (call.arguments_json, f"tool_calls[{index}].arguments_json"),
        ]
    strings += [(text, "metadata") for item in value.metadata.items() for text in item]
    for text, name in strings:
        validation.text(text, f"{field}.{name}", max_bytes=None, reason="INVALID_OUTCOME")
    if value.native_json:
        validation.json_document(
            value.native_json,
            f"{field}.native_json",
            "INVALID_NATIVE_JSON",
            max_depth=max_json_depth,
        )


def messages_size(size: int, field: str, *, max_bytes: int) -> None:
    """The messages of one write, `size` bytes together, within `max_bytes` (APPEND_TOO_LARGE)."""
    if size > max_bytes:
        raise invalid_argument(
            "APPEND_TOO_LARGE",
            f"{field} exceeds {max_bytes} bytes in total",
            field=field,
            limit_bytes=max_bytes,
        )


def _tool_id(value: str, field: str) -> None:
    if not 1 <= len(value) <= MAX_TOOL_ID_CHARS or "\x00" in value:
        raise invalid_argument(
            "INVALID_TOOL_CALL", f"{field} must be 1..{MAX_TOOL_ID_CHARS} characters", field=field
        )


def stored_message(value: Message, field: str, limits: MessageLimits) -> int:
    """`message` plus the role rules of a stored message (tool calls only on assistant
    messages, tool_call_id only on tool results, tool call ids, names and arguments
    within their limits). Returns the message's size in bytes."""
    size = message(
        value, field, max_bytes=limits.max_message_bytes, max_json_depth=limits.max_json_depth
    )
    if value.role != Role.ASSISTANT and value.tool_calls:
        raise invalid_argument(
            "INVALID_MESSAGE",
            "only assistant messages carry tool calls",
            field=f"{field}.tool_calls",
        )
    if value.role != Role.TOOL and value.tool_call_id:
        raise invalid_argument(
            "INVALID_MESSAGE",
            "only tool messages carry tool_call_id",
            field=f"{field}.tool_call_id",
        )
    if value.role == Role.ASSISTANT and not value.text and not value.tool_calls:
        raise invalid_argument(
            "INVALID_MESSAGE", "an assistant message needs text or tool calls", field=field
        )
    if value.role == Role.TOOL:
        _tool_id(value.tool_call_id, f"{field}.tool_call_id")
    if len(value.tool_calls) > limits.max_tool_calls_per_message:
        raise invalid_argument(
            "TOO_MANY_TOOL_CALLS",
            f"a message carries at most {limits.max_tool_calls_per_message} tool calls",
            field=f"{field}.tool_calls",
        )
    seen: set[str] = set()
    for index, call in enumerate(value.tool_calls):
        call_field = f"{field}.tool_calls[{index}]"
        _tool_id(call.id, f"{call_field}.id")
        if call.id in seen:
            raise invalid_argument(
                "INVALID_TOOL_CALL", "tool call ids must be unique", field=f"{call_field}.id"
            )
        seen.add(call.id)
        if not 1 <= len(call.name) <= MAX_TOOL_NAME_CHARS or "\x00" in call.name:
            raise invalid_argument(
                "INVALID_TOOL_CALL",
                f"tool names must be 1..{MAX_TOOL_NAME_CHARS} characters",
                field=f"{call_field}.name",
            )
        validation.text(
            call.arguments_json,
            f"{call_field}.arguments_json",
            max_bytes=limits.max_message_bytes,
            reason="INVALID_TOOL_CALL",
        )
    return size


def append_messages(
    messages: Sequence[Message],
    limits: MessageLimits,
    field: str = "messages",
    allow_empty: bool = False,
) -> None:
    """Every rule of one append: its count, each stored message, its total size (no
    message at all only when `allow_empty`: a write that retracts or changes state)."""
    if not messages and not allow_empty:
        raise invalid_argument("NO_MESSAGES", f"{field} must not be empty", field=field)
    message_count(len(messages), limits.max_messages_per_append, field)
    total = sum(
        stored_message(value, f"{field}[{index}]", limits) for index, value in enumerate(messages)
    )
    messages_size(total, field, max_bytes=limits.max_append_bytes)
