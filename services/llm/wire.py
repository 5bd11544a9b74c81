"""The chat-completions wire: a ChatRequest as the arguments of the openai SDK's
`chat.completions.create`, and its answers (a chat.completion document, or the
chunks of a stream) as a ChatResponse. What a provider answers is checked here:
anything unusable is ModelFailed."""

from __future__ import annotations

import json
from typing import Any

from openai.types.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessageFunctionToolCall,
)

from services.common.domain import ToolCall, ToolDefinition, Usage
from services.common.errors import invalid_argument
from services.llm.model import ChatMessage, ChatRequest, ChatResponse, ModelFailed, estimate_tokens


def chat_arguments(model: str, request: ChatRequest) -> dict[str, Any]:
    """The keyword arguments of `chat.completions.create` for `request` (no `stream`)."""
    arguments: dict[str, Any] = {
        "model": model,
        "messages": [_message(m) for m in request.messages],
    }
    if request.max_output_tokens is not None:
        arguments["max_tokens"] = request.max_output_tokens
    if request.temperature is not None:
        arguments["temperature"] = request.temperature
    if request.tools:
        arguments["tools"] = [_tool(t) for t in request.tools]
    if request.response_format is not None:
        fmt = request.response_format
        arguments["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": fmt.name, "schema": dict(fmt.schema), "strict": fmt.strict},
        }
    return arguments


def _message(message: ChatMessage) -> dict[str, Any]:
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        wire["content"] = message.content or None
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_json or "{}"},
            }
            for call in message.tool_calls
        ]
    if message.role == "tool":
        wire["tool_call_id"] = message.tool_call_id
    return wire


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    try:
        parameters = (
            json.loads(tool.parameters_json_schema)
            if tool.parameters_json_schema
            else {"type": "object", "properties": {}}
        )
    except ValueError:
        raise invalid_argument(
            "INVALID_TOOL", "a tool's parameters_json_schema is not valid JSON", field="tools"
        ) from None
    function: dict[str, Any] = {"name": tool.name, "parameters": parameters}
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _usage(reported: Any, request: ChatRequest, text: str) -> Usage:
    """Usage as reported, or estimated when the provider sent none (budgets need a figure)."""
    prompt = getattr(reported, "prompt_tokens", None)
    if isinstance(prompt, int):
        completion = getattr(reported, "completion_tokens", None)
        return Usage(prompt, completion if isinstance(completion, int) else 0, 1)
    estimate = sum(estimate_tokens(m.content) for m in request.messages)
    return Usage(estimate, estimate_tokens(text), 1)


def _tool_call(call: object) -> ToolCall:
    if not isinstance(call, ChatCompletionMessageFunctionToolCall) or not isinstance(
        getattr(call.function, "name", None), str
    ):
        raise ModelFailed("the model answered malformed tool calls")
    return ToolCall(str(call.id or ""), call.function.name, str(call.function.arguments or ""))


def parse_completion(document: Any, request: ChatRequest) -> ChatResponse:
    """A ChatResponse from a non-streamed chat.completion document (the JSON the adapter
    read under its size cap), through the SDK's models built without validation, as the
    SDK builds them (a provider's extra or missing fields pass), then checked here."""
    try:
        completion = ChatCompletion.construct(**document)
        choice = completion.choices[0]
        content = choice.message.content or ""
        calls = tuple(_tool_call(call) for call in choice.message.tool_calls or ())
    except (AttributeError, IndexError, TypeError):
        raise ModelFailed("the model answered something that is not a chat completion") from None
    if not isinstance(content, str):
        raise ModelFailed("the model answered non-text content")
    return ChatResponse(
        text=content,
        tool_calls=calls,
        usage=_usage(completion.usage, request, content),
        finish_reason=str(getattr(choice, "finish_reason", None) or "stop"),
    )


class StreamState:
    """Accumulates the chunks of a streamed completion (the SDK's ChatCompletionChunk,
    built without validation: a field may hold anything the provider sent)."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.usage: Any = None
        self.finish_reason = ""

    def feed(self, chunk: ChatCompletionChunk) -> str:
        """Take one chunk; return its text delta."""
        try:
            return self._feed(chunk)
        except (AttributeError, TypeError, ValueError):
            raise ModelFailed("the model streamed a malformed chunk") from None

    def _feed(self, chunk: ChatCompletionChunk) -> str:
        if chunk.usage:
            self.usage = chunk.usage
        delta_text = ""
        for choice in chunk.choices or ():
            delta = choice.delta
            if isinstance(delta.content, str):
                delta_text += delta.content
            for piece in delta.tool_calls or ():
                call = self.calls.setdefault(
                    int(piece.index or 0), {"id": "", "name": "", "arguments": []}
                )
                if piece.id:
                    call["id"] = piece.id
                function = piece.function
                if function is not None and function.name and not call["name"]:
                    call["name"] = function.name
                if function is not None and function.arguments:
                    call["arguments"].append(function.arguments)
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
        self.text.append(delta_text)
        return delta_text

    def response(self, request: ChatRequest) -> ChatResponse:
        text = "".join(self.text)
        calls = tuple(
            ToolCall(call["id"], call["name"], "".join(call["arguments"]))
            for _, call in sorted(self.calls.items())
        )
        if any(not call.name for call in calls):
            raise ModelFailed("the model streamed a tool call without a name")
        return ChatResponse(
            text=text,
            tool_calls=calls,
            usage=_usage(self.usage, request, text),
            finish_reason=self.finish_reason or "stop",
        )
