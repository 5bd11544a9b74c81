"""What the transcript tests share: messages, a service on a store, a conversation, and
the base of the contract suites (each feature's cases.py), which run on the in-memory
store (double.py) and on PostgreSQL alike: both stores must give the domain the same
guarantees.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.common.domain import Message, Role, ToolCall
from services.common.errors import DomainError
from services.common.pagination import PageTokens
from services.transcript.config import TranscriptLimits
from services.transcript.conversations.model import StateChange
from services.transcript.service import TranscriptService
from services.transcript.store import TranscriptStore


def user(text: str = "hello") -> Message:
    return Message(Role.USER, text)


def assistant(text: str = "hi", *calls: str) -> Message:
    return Message(
        Role.ASSISTANT, text, tool_calls=tuple(ToolCall(c, "lookup", '{"q": 1}') for c in calls)
    )


def tool(call_id: str, text: str = "result") -> Message:
    return Message(Role.TOOL, text, tool_call_id=call_id)


def make_service(store: TranscriptStore, **limits: Any) -> TranscriptService:
    return TranscriptService(
        store, TranscriptLimits(**limits), PageTokens(b"secret-for-tests-0123")
    )


async def new_conversation(service: TranscriptService, namespace: str) -> str:
    conversation, created = await service.create_conversation(namespace, "", {})
    assert created
    return str(conversation.conversation_id)


def reason_of(error: pytest.ExceptionInfo[DomainError]) -> str:
    return error.value.reason


def delta(
    conversation: object = None, user_state: object = None, namespace: object = None
) -> StateChange:
    """A StateChange of JSON objects (None: no change of that scope)."""
    parts = (conversation, user_state, namespace)
    return StateChange(*(None if part is None else json.dumps(part) for part in parts))


async def created(service: TranscriptService, namespace: str, user_id: str = "alice") -> str:
    conversation, _ = await service.create_conversation(namespace, "", {}, user_id)
    return str(conversation.conversation_id)


class ServiceCases:
    """Cases of TranscriptService on a store. Subclasses provide a `store` fixture."""

    @pytest.fixture
    def service(self, store: TranscriptStore) -> TranscriptService:
        return make_service(store)
