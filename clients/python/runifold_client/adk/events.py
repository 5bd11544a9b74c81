"""ADK events as Runifold messages, and back: the event verbatim, a readable text beside it."""

from __future__ import annotations

import json

from google.adk.events.event import Event
from google.genai import types

from runifold.common.v1 import common_pb2
from runifold_client import _framework as fw


def _text_of(content: types.Content | None) -> str:
    """A readable rendering of an event's content for summaries and memory."""
    if content is None or not content.parts:
        return ""
    pieces = []
    for part in content.parts:
        if part.text:
            pieces.append(part.text)
        elif part.function_call:
            call = part.function_call
            pieces.append(f"[tool call {call.name}({json.dumps(call.args, default=str)})]")
        elif part.function_response:
            answer = part.function_response
            pieces.append(
                f"[tool result {answer.name}: {json.dumps(answer.response, default=str)}]"
            )
        elif part.inline_data:
            pieces.append(f"[{part.inline_data.mime_type or 'data'}]")
        else:
            pieces.append("[part]")
    return "\n".join(pieces)


def event_to_message(event: Event) -> common_pb2.Message:
    """One ADK event as a Runifold message: the event verbatim in `native_json`, its
    author's role and a readable (clipped) text beside it."""
    text = _text_of(event.content).strip()
    if not text:
        text = "[state change]" if event.content is None else "[event]"
    return common_pb2.Message(
        role=common_pb2.ROLE_USER if event.author == "user" else common_pb2.ROLE_ASSISTANT,
        text=fw.clip(text),
        native_json=event.model_dump_json(exclude_none=True),
        metadata={"adk.author": fw.clip(event.author, fw.MAX_LABEL_CHARS)},
    )


def entry_to_event(entry: common_pb2.Entry) -> Event:
    """The ADK event an entry holds, exactly as it was appended."""
    return Event.model_validate_json(entry.message.native_json)
