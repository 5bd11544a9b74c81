"""A deterministic offline chat model: the embedded default and the tests' model.

It needs no network. Its answer reports what context it received (the
summary, the memories, the window) so that `make run` shows memory and
summaries at work. With tools declared, a user message that names a tool
makes it call that tool; tool results make it answer from them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator

from services.common.domain import ToolCall, Usage
from services.llm.model import (
    ChatDelta,
    ChatMessage,
    ChatRequest,
    ChatResponse,
    estimate_tokens,
)

_MEMORY = re.compile(r"<memory id=\"[^\"]*\" score=\"[^\"]*\">(.*?)</memory>", re.S)
_SUMMARY = re.compile(r"<summary through_sequence=\"(\d+)\"[^>]*>(.*?)</summary>", re.S)


def _clip(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class OfflineChatModel:
    """ChatModel without a network; same input, same answer."""

    provider = "offline"

    def __init__(self, model: str = "offline-echo") -> None:
        self.model = model

    def _answer(self, request: ChatRequest) -> ChatResponse:
        messages = list(request.messages)
        context = next(
            (m.content for m in messages if m.role == "user" and 'trust="untrusted"' in m.content),
            "",
        )
        conversation = [
            m
            for m in messages
            if m.role != "system" and not (m.role == "user" and 'trust="untrusted"' in m.content)
        ]
        last = conversation[-1] if conversation else ChatMessage("user", "")
        tool_names = {tool.name for tool in request.tools}

        if last.role == "user":
            asked = [name for name in sorted(tool_names) if name in last.content]
            if asked:
                digest = hashlib.sha256(last.content.encode()).hexdigest()[:12]
                calls = tuple(
                    ToolCall(f"call_{digest}_{i}", name, json.dumps({"query": _clip(last.content)}))
                    for i, name in enumerate(asked)
                )
                return self._response("", calls, request)

        lines = []
        summary = _SUMMARY.search(context)
        if summary:
            lines.append(f"Summary (through {summary[1]}): {_clip(summary[2])}")
        memories = _MEMORY.findall(context)
        if memories:
            lines.append(f"I remember {len(memories)} thing(s):")
            lines.extend(f"- {_clip(m)}" for m in memories)
        lines.append(f"Context: {len(conversation) - 1} earlier message(s) in the window.")
        if last.role == "tool":
            results = [m.content for m in conversation if m.role == "tool"][-8:]
            lines.append("Tool results: " + "; ".join(_clip(r, 80) for r in results))
        else:
            lines.append(f"You said: {_clip(last.content)}")
        return self._response("\n".join(lines), (), request)

    def _response(
        self, text: str, calls: tuple[ToolCall, ...], request: ChatRequest
    ) -> ChatResponse:
        limit = request.max_output_tokens
        if limit is not None and estimate_tokens(text) > limit:
            text = text.encode()[: limit * 4].decode(errors="ignore")
        prompt = sum(estimate_tokens(m.content) for m in request.messages)
        completion = estimate_tokens(text) + sum(estimate_tokens(c.arguments_json) for c in calls)
        return ChatResponse(
            text=text,
            tool_calls=calls,
            usage=Usage(prompt, completion, 1),
            finish_reason="tool_calls" if calls else "stop",
        )

    async def complete(self, request: ChatRequest, *, timeout: float) -> ChatResponse:
        return self._answer(request)

    async def stream(
        self, request: ChatRequest, *, timeout: float
    ) -> AsyncIterator[ChatDelta | ChatResponse]:
        response = self._answer(request)
        for line in response.text.splitlines(keepends=True):
            yield ChatDelta(line)
        yield response
