"""The chat-model interface shared by the summarizer, the agent and the memory proposer.

Domain code talks to `ChatModel`; providers implement it: an
OpenAI-compatible chat-completions client (`OpenAIChatModel`, in
services/llm/openai.py) and deterministic offline models (the
summarizer's and the agent's) for the embedded default and tests.

Roles here are the model API's roles ("system", "user", "assistant",
"tool"): the system role exists on this side only and never reaches a
transcript.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from services.common.domain import Budget, Role, ToolCall, ToolDefinition, Usage
from services.common.errors import Code, DomainError

ChatRole = Literal["system", "user", "assistant", "tool"]

# The transcript roles as the model API names them (a transcript holds no system role).
CHAT_ROLES: dict[Role, ChatRole] = {
    Role.USER: "user",
    Role.ASSISTANT: "assistant",
    Role.TOOL: "tool",
}


def estimate_tokens(text: str) -> int:
    """A rough token count, 4 UTF-8 bytes a token (rounded up): what budgets are
    checked with before a call, and the usage reported where no provider counts."""
    return (len(text.encode("utf-8", "surrogatepass")) + 3) // 4


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a model request."""

    role: ChatRole
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""


@dataclass(frozen=True, slots=True)
class JsonSchemaFormat:
    """Structured output: the answer must be a JSON document of `schema` (OpenAI's
    `response_format` of type `json_schema`; `strict` asks the provider to enforce it).
    The caller still checks what comes back: not every provider enforces a schema."""

    name: str
    schema: Mapping[str, Any]
    strict: bool = True


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A model request. `max_output_tokens` None means the provider's default."""

    messages: Sequence[ChatMessage]
    max_output_tokens: int | None = None
    tools: Sequence[ToolDefinition] = ()
    temperature: float | None = None
    response_format: JsonSchemaFormat | None = None


@dataclass(frozen=True, slots=True)
class ChatResponse:
    """The model's answer: text and/or tool calls, and what it cost."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    finish_reason: str = "stop"


@dataclass(frozen=True, slots=True)
class ChatDelta:
    """A piece of streamed text (the stream ends with one ChatResponse)."""

    text: str


class ChatModel(Protocol):
    """A chat model. Implementations must honour `timeout` (seconds) and cancellation."""

    @property
    def provider(self) -> str:
        """Short provider label for metrics ("openai", "offline")."""

    @property
    def model(self) -> str:
        """Model name as the provider knows it."""

    async def complete(self, request: ChatRequest, *, timeout: float) -> ChatResponse:
        """One completion."""

    def stream(
        self, request: ChatRequest, *, timeout: float
    ) -> AsyncIterator[ChatDelta | ChatResponse]:
        """Text deltas as they arrive, then exactly one final ChatResponse."""


class ModelUnavailable(DomainError):
    """The model endpoint could not be reached or answered 5xx/429 after retries."""

    def __init__(self, message: str = "the model is unavailable; retry later") -> None:
        super().__init__(Code.UNAVAILABLE, "MODEL_UNAVAILABLE", message)


class ModelFailed(DomainError):
    """The model endpoint refused the request or answered something unusable."""

    def __init__(self, message: str = "the model could not answer this request") -> None:
        super().__init__(Code.FAILED_PRECONDITION, "MODEL_FAILED", message)


class ModelTimeout(DomainError):
    """The model did not answer before the deadline."""

    def __init__(self) -> None:
        super().__init__(
            Code.DEADLINE_EXCEEDED,
            "DEADLINE_EXCEEDED",
            "the model did not answer before the deadline",
        )


def budget_exhausted(what: str, limit: int) -> DomainError:
    """RESOURCE_EXHAUSTED / BUDGET_EXHAUSTED: the caller's budget does not cover a call."""
    return DomainError(
        Code.RESOURCE_EXHAUSTED,
        "BUDGET_EXHAUSTED",
        f"the budget's {what} ({limit}) is exhausted",
        metadata={"limit": limit, "dimension": what},
    )


def with_defaults(budget: Budget, defaults: Budget) -> Budget:
    """The caller's budget with each zero field taken from the server's `defaults`."""
    return Budget(
        max_output_tokens=budget.max_output_tokens or defaults.max_output_tokens,
        max_model_calls=budget.max_model_calls or defaults.max_model_calls,
        max_input_tokens=budget.max_input_tokens or defaults.max_input_tokens,
    )


def budget_left(budget: Budget, used: Usage) -> Budget:
    """What is left of `budget` once `used` is spent (fields may go below zero)."""
    return Budget(
        max_output_tokens=budget.max_output_tokens - used.output_tokens,
        max_model_calls=budget.max_model_calls - used.model_calls,
        max_input_tokens=budget.max_input_tokens - used.input_tokens,
    )


def require_call(budget: Budget, used: Usage, input_tokens: int = 0) -> Budget:
    """What is left of `budget` after `used`, when it covers one more model call
    sending `input_tokens`; BUDGET_EXHAUSTED naming the first limit it breaks otherwise
    (calls, then output tokens, then input tokens)."""
    left = budget_left(budget, used)
    if left.max_model_calls < 1:
        raise budget_exhausted("max_model_calls", budget.max_model_calls)
    if left.max_output_tokens < 1:
        raise budget_exhausted("max_output_tokens", budget.max_output_tokens)
    if left.max_input_tokens < max(1, input_tokens):
        raise budget_exhausted("max_input_tokens", budget.max_input_tokens)
    return left
