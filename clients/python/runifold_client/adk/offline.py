"""An offline model for ADK agents, for examples and tests."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types

from runifold_client import _framework as fw


class OfflineLlm(BaseLlm):  # type: ignore[misc]  # google.adk: untyped
    """An offline, deterministic ADK model, for examples and tests: no network, no key.

    It answers every request with one text: how many messages came before the user's
    last one (so a session's history shows) and that message echoed, as Runifold's
    offline agent does ("Context: 2 earlier message(s).\\nYou said: ..."). It never
    calls a tool.

    >>> agent = LlmAgent(name="helper", model=OfflineLlm())

    Swap it for a real model (`model="gemini-2.5-flash"`, or any BaseLlm) to get real
    answers.
    """

    model: str = "runifold-offline"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        said = [
            "\n".join(part.text for part in content.parts or [] if part.text)
            for content in llm_request.contents or []
            if content.role in {"user", "model"} and any(p.text for p in content.parts or [])
        ]
        answer = fw.offline_answer(said)
        # Usage as a model reports it (words for tokens), so that ADK's accounting runs.
        prompt, output = sum(len(text.split()) for text in said), len(answer.split())
        yield LlmResponse(
            content=types.Content(role="model", parts=[types.Part(text=answer)]),
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=prompt,
                candidates_token_count=output,
                total_token_count=prompt + output,
            ),
        )
