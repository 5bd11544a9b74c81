"""The model's reply as a turn appends it, checked against the transcript's rules first."""

from __future__ import annotations

import uuid

from services.agent import metrics
from services.agent.model import ModelOutputInvalid, Outcome, Turn
from services.common import messages as message_rules
from services.common.domain import Message, Role, ToolCall
from services.common.errors import DomainError, invalid_argument
from services.common.messages import MessageLimits
from services.llm.model import ChatResponse, ModelFailed


def assistant_message(response: ChatResponse) -> Message:
    """The model's reply as the assistant message the turn appends: tool call ids made
    unique (a missing or repeated id gets one of ours)."""
    calls: list[ToolCall] = []
    seen: set[str] = set()
    for index, call in enumerate(response.tool_calls):
        call_id = (
            call.id if call.id and call.id not in seen else f"call_{uuid.uuid4().hex[:12]}_{index}"
        )
        seen.add(call_id)
        calls.append(ToolCall(call_id, call.name, call.arguments_json))
    if not response.text.strip() and not calls:
        raise ModelFailed("the model returned neither text nor tool calls")
    return Message(Role.ASSISTANT, response.text, tuple(calls))


def check_reply(turn: Turn, reply: Message, outcome: Outcome, limits: MessageLimits) -> None:
    """The reply within the transcript's rules, or MODEL_OUTPUT_INVALID with the outcome."""
    try:
        size = message_rules.stored_message(reply, "output[0]", limits)
        count = len(turn.input) + 1
        if count > limits.max_messages_per_append:
            raise invalid_argument(
                "TOO_MANY_MESSAGES",
                f"input and output make {count} messages; an append carries at most "
                f"{limits.max_messages_per_append}",
                field="output",
            )
        size += sum(m.size_bytes() for m in turn.input)
        message_rules.messages_size(size, "output", max_bytes=limits.max_append_bytes)
    except DomainError as error:
        metrics.MODEL_OUTPUT_INVALID.inc()
        raise ModelOutputInvalid(outcome, [f"{error.field}: {error.message}"]) from None
