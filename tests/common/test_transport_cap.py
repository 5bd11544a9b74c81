"""The transport cap's arithmetic (services/common/server.py): the largest append and the
largest turn fit, little more does."""

from __future__ import annotations

import uuid

import pytest

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.common.v1 import common_pb2
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.agent.config import AgentConfig
from services.agent.turn import inputs
from services.common import messages, validation
from services.common.server import MIN_RECEIVE_MESSAGE_BYTES, receive_cap
from services.common.settings import TransportLimits
from services.transcript.component import TranscriptComponent
from services.transcript.config import TranscriptLimits

# Admission keeps each call's slot in a context variable: none left behind (conftest.py).
pytestmark = pytest.mark.usefixtures("own_context")


def _largest_append(limits: messages.MessageLimits) -> transcript_pb.AppendEntriesRequest:
    """An AppendEntries as large on the wire as the limits allow: every message with
    the most metadata entries and tool calls, their bytes adding up to the limit."""
    count, calls = limits.max_messages_per_append, limits.max_tool_calls_per_message
    metadata = {
        f"k{i:0{validation.MAX_METADATA_KEY_CHARS - 1}d}": "v" * 200
        for i in range(validation.MAX_METADATA_ENTRIES)
    }
    tool_calls = [
        common_pb2.ToolCall(id=f"call-{i}", name="lookup", arguments_json="{}")
        for i in range(calls)
    ]
    framing_free = sum(len(k) + len(v) for k, v in metadata.items()) + sum(
        len(c.id) + len(c.name) + len(c.arguments_json) for c in tool_calls
    )
    text = "x" * (limits.max_append_bytes // count - framing_free)
    return transcript_pb.AppendEntriesRequest(
        conversation_id=str(uuid.uuid4()),
        namespace="n" * 128,
        request_id="r" * 128,
        expected_version=2**62,
        fencing_token=2**62,
        messages=[
            common_pb2.Message(
                role=common_pb2.ROLE_ASSISTANT, text=text, tool_calls=tool_calls, metadata=metadata
            )
            for _ in range(count)
        ],
    )


def test_the_largest_append_fits_the_transport_cap_and_little_more_does() -> None:
    limits = TranscriptLimits().messages
    largest = _largest_append(limits).ByteSize()
    bound = messages.append_request_bytes(limits)
    cap = receive_cap([TranscriptComponent(TranscriptLimits())], TransportLimits())
    assert largest <= bound <= cap
    # "Just above": the cap leaves less than a tenth of the append limit on top.
    assert cap < largest + limits.max_append_bytes // 10
    assert cap < 16 * 1024 * 1024 // 3  # the old cap was 16 MiB


def test_the_largest_turn_fits_the_agents_bound() -> None:
    config = AgentConfig()
    tools = [
        common_pb2.ToolDefinition(
            name=f"{i:064d}",
            description="d" * 16 * 1024,
            parameters_json_schema="{" + " " * (config.max_tool_schema_bytes - 2) + "}",
        )
        for i in range(config.max_tools)
    ]
    per_message = config.max_input_bytes // config.max_input_messages
    request = agent_pb.RunConversationRequest(
        conversation_id=str(uuid.uuid4()),
        namespace="n" * 128,
        turn_id="t" * 128,
        input=[
            common_pb2.Message(role=common_pb2.ROLE_USER, text="u" * per_message)
            for _ in range(config.max_input_messages)
        ],
        tools=tools,
        system_instructions="s" * config.max_system_instructions_bytes,
    )
    assert request.ByteSize() <= inputs.request_bytes(config)


def test_an_explicit_cap_wins_and_small_services_get_the_floor() -> None:
    assert receive_cap([], TransportLimits(max_receive_message_bytes=16 << 20)) == 16 << 20
    assert receive_cap([], TransportLimits()) == MIN_RECEIVE_MESSAGE_BYTES
