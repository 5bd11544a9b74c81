"""Proposers behind one interface: the Proposer protocol, and the chat-model proposer
(any OpenAI-compatible provider, asked for structured output with the JSON schema of
prompt.py). The offline one is in offline.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from services.common.domain import Entry, Usage
from services.llm.model import ChatMessage, ChatModel, ChatRequest, ModelFailed
from services.memory.proposals.model import RelatedMemory
from services.memory.proposals.prompt import RESPONSE_FORMAT, ProposalPrompt, build_prompt


@dataclass(frozen=True, slots=True)
class ProposerOutput:
    """The items a proposer answered (unchecked, in the schema's shape) and their cost."""

    items: Sequence[Any]
    usage: Usage


class Proposer(Protocol):
    """Proposes memories from transcript entries and the related stored memories."""

    @property
    def provider(self) -> str:
        """Short provider label ("openai", "offline")."""

    def prepare(
        self,
        entries: Sequence[Entry],
        related: Sequence[RelatedMemory],
        *,
        max_proposals: int,
        max_output_tokens: int,
    ) -> ProposalPrompt:
        """The prompt of the call and the tokens it sends (checked against the budget first)."""

    async def propose(self, prompt: ProposalPrompt, *, timeout: float) -> ProposerOutput:
        """The proposals. Raises the model errors of services.llm.model."""


class _PromptBuilder:
    """The prompt both proposers build: the model's input, and the offline proposer's
    measure of its usage (counted as a model's would be)."""

    max_entry_chars: int

    def prepare(
        self,
        entries: Sequence[Entry],
        related: Sequence[RelatedMemory],
        *,
        max_proposals: int,
        max_output_tokens: int,
    ) -> ProposalPrompt:
        return build_prompt(
            entries,
            related,
            max_proposals=max_proposals,
            max_output_tokens=max_output_tokens,
            max_entry_chars=self.max_entry_chars,
        )


class ChatModelProposer(_PromptBuilder):
    """A proposer over any ChatModel (the OpenAI-compatible client in production)."""

    def __init__(self, model: ChatModel, *, max_entry_chars: int) -> None:
        self.model = model
        self.max_entry_chars = max_entry_chars

    @property
    def provider(self) -> str:
        return self.model.provider

    async def propose(self, prompt: ProposalPrompt, *, timeout: float) -> ProposerOutput:
        request = ChatRequest(
            messages=(ChatMessage("system", prompt.system), ChatMessage("user", prompt.user)),
            max_output_tokens=prompt.max_output_tokens,
            temperature=0.0,
            response_format=RESPONSE_FORMAT,
        )
        response = await self.model.complete(request, timeout=timeout)
        try:
            document = json.loads(response.text)
        except ValueError:
            raise ModelFailed("the model's proposals are not the JSON document asked for") from None
        items = document.get("proposals") if isinstance(document, dict) else None
        if not isinstance(items, list):
            raise ModelFailed("the model's proposals are not the JSON document asked for")
        return ProposerOutput(items, response.usage)
