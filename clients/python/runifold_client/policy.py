"""Context policy and message helpers, the client-side vocabulary of a turn."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.common.v1 import common_pb2

SummaryModeName = Literal["require", "auto"]
# "default": the namespace's (the server's RUNIFOLD_CURATION, RUNIFOLD_CURATION_NAMESPACES).
CurationModeName = Literal["default", "off", "auto"]

_CURATION = {
    "default": agent_pb.CURATION_MODE_UNSPECIFIED,
    "off": agent_pb.CURATION_MODE_OFF,
    "auto": agent_pb.CURATION_MODE_AUTO,
}


@dataclass(frozen=True)
class ConversationContextPolicy:
    """Bounds of what a turn gives the model.

    window: recent entries given verbatim (1..4096).
    summary_batch: entries summarized per pass (1..4096).
    memory_limit: memories retrieved (0 turns semantic memory off; at most 256).
    summary_mode: what a turn does when entries outside its window are not summarized.
        "auto" (the default) runs the trusted summarizer first, in at most
        max_summary_passes, charged to the turn's budget; "require" fails with
        SummaryRequired and enqueues a background job (the seed's semantics).
        The server's background queue keeps summaries ahead of the window, so with
        either mode a turn finds nothing to summarize while the queue keeps up: "auto"
        only pays for a summary when the queue has fallen behind, and a chat loop
        never sees SummaryRequired.
    curation: "auto" asks for the automatic curation of the conversation into memory
        once the turn commits (in the background); "off" does not; "default" leaves it
        to the namespace's default (on in the all-in-one server, off in a service
        deployed alone unless its operator set it).

    The defaults are those of `runifold chat` and `runifold turn` too.
    """

    window: int = 16
    summary_batch: int = 64
    memory_limit: int = 0
    summary_mode: SummaryModeName = "auto"
    max_summary_passes: int = 1
    curation: CurationModeName = "default"

    def with_curation(self, mode: CurationModeName = "auto") -> ConversationContextPolicy:
        """The same policy with curation after the turn "auto" (or "off", "default")."""
        if mode not in _CURATION:
            raise ValueError("curation must be 'default', 'off' or 'auto'")
        return replace(self, curation=mode)

    def with_semantic_memory(self, limit: int) -> ConversationContextPolicy:
        """The same policy with bounded memory lookup (1..256)."""
        if not 1 <= limit <= 256:
            raise ValueError("semantic memory limit must be 1..256")
        return replace(self, memory_limit=limit)

    def with_auto_summary(self, max_passes: int = 1) -> ConversationContextPolicy:
        """The same policy, summarizing automatically (charged to the turn's budget)."""
        if not 1 <= max_passes <= 64:
            raise ValueError("max_passes must be 1..64")
        return replace(self, summary_mode="auto", max_summary_passes=max_passes)

    def with_summary_required(self) -> ConversationContextPolicy:
        """The same policy, refusing with SummaryRequired (and enqueueing a background
        job) when entries outside the window are not summarized: the turn never pays
        for a summary."""
        return replace(self, summary_mode="require")

    def to_proto(self) -> agent_pb.ContextPolicy:
        return agent_pb.ContextPolicy(
            window=self.window,
            summary_batch=self.summary_batch,
            memory_limit=self.memory_limit,
            summary_mode=(
                agent_pb.SUMMARY_MODE_AUTO
                if self.summary_mode == "auto"
                else agent_pb.SUMMARY_MODE_REQUIRE
            ),
            max_summary_passes=self.max_summary_passes,
            curation=_CURATION[self.curation],
        )


@dataclass(frozen=True)
class Budget:
    """Limits of one turn; 0 means the server's default."""

    max_output_tokens: int = 0
    max_model_calls: int = 0
    max_input_tokens: int = 0

    def to_proto(self) -> common_pb2.Budget:
        return common_pb2.Budget(
            max_output_tokens=self.max_output_tokens,
            max_model_calls=self.max_model_calls,
            max_input_tokens=self.max_input_tokens,
        )


@dataclass(frozen=True)
class Tool:
    """A tool the model may call; it runs in your process."""

    name: str
    description: str = ""
    parameters_json_schema: str = '{"type": "object"}'

    def to_proto(self) -> common_pb2.ToolDefinition:
        return common_pb2.ToolDefinition(
            name=self.name,
            description=self.description,
            parameters_json_schema=self.parameters_json_schema,
        )


def user(text: str, metadata: Mapping[str, str] | None = None) -> common_pb2.Message:
    """A user message."""
    return common_pb2.Message(role=common_pb2.ROLE_USER, text=text, metadata=metadata or {})


def assistant(text: str) -> common_pb2.Message:
    """An assistant message (for direct transcript appends)."""
    return common_pb2.Message(role=common_pb2.ROLE_ASSISTANT, text=text)


def tool_result(tool_call_id: str, text: str) -> common_pb2.Message:
    """The result of a tool call the model asked for, to send as the next turn's input."""
    return common_pb2.Message(role=common_pb2.ROLE_TOOL, text=text, tool_call_id=tool_call_id)


InputLike = str | common_pb2.Message | Sequence[str | common_pb2.Message]


def messages(value: InputLike) -> list[common_pb2.Message]:
    """Input as messages: a string is a user message."""
    items: Iterable[str | common_pb2.Message] = (
        [value] if isinstance(value, str | common_pb2.Message) else value
    )
    return [user(item) if isinstance(item, str) else item for item in items]
