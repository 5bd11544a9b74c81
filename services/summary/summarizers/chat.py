"""The summarizer over a chat model (the OpenAI-compatible client in production)."""

from __future__ import annotations

from services.llm.model import ChatMessage, ChatModel, ChatRequest
from services.summary.summarizers.prompt import PromptBuilder, SummaryOutput, SummaryPrompt


class ChatModelSummarizer(PromptBuilder):
    """A summarizer over any ChatModel (the OpenAI-compatible client in production)."""

    def __init__(self, model: ChatModel, *, max_entry_chars: int, max_summary_bytes: int) -> None:
        self.model = model
        self.max_entry_chars = max_entry_chars
        self.max_summary_bytes = max_summary_bytes

    @property
    def provider(self) -> str:
        return self.model.provider

    async def summarize(self, prompt: SummaryPrompt, *, timeout: float) -> SummaryOutput:
        request = ChatRequest(
            messages=(ChatMessage("system", prompt.system), ChatMessage("user", prompt.user)),
            max_output_tokens=prompt.max_output_tokens,
            temperature=0.0,
        )
        response = await self.model.complete(request, timeout=timeout)
        return SummaryOutput(response.text.strip(), response.usage)
