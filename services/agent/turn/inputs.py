"""The checks of a turn request, before anything is read or any model is called.

Every rule a turn's append would enforce is applied here too (the transcript's
message rules, services/common/messages.py), so that a request the transcript
would refuse never costs a model call. Tool definitions have their own rules
(names the model can call: 1..64 characters of [A-Za-z0-9_-]).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from services.agent.config import AgentConfig
from services.agent.model import Turn
from services.common import messages as message_rules
from services.common import validation
from services.common.domain import Role, ToolDefinition
from services.common.errors import invalid_argument

_TOOL_NAME = re.compile(r"[A-Za-z0-9_\-]{1,64}")
_MAX_TOOL_NAME_BYTES = 64
_MAX_TOOL_DESCRIPTION_BYTES = 16 * 1024
# Protobuf framing of one ToolDefinition: its tag and length, and those of its fields.
_TOOL_FRAMING = 6 + 3 * 5


def request_bytes(config: AgentConfig) -> int:
    """The size of the largest turn request the limits allow (input, tools, system
    instructions): what the transport must accept (services/common/server.py)."""
    tool = (
        _TOOL_FRAMING
        + _MAX_TOOL_NAME_BYTES
        + _MAX_TOOL_DESCRIPTION_BYTES
        + config.max_tool_schema_bytes
    )
    return (
        message_rules.REQUEST_FIELDS_BOUND
        # Input holds user messages and tool results: no tool calls.
        + message_rules.messages_wire_bytes(config.max_input_messages, config.max_input_bytes, 0)
        + config.max_tools * tool
        + 5
        + config.max_system_instructions_bytes
    )


def check_counts(input_count: int, tool_count: int, config: AgentConfig) -> None:
    """The counts of a turn request's repeated fields, checked before they are converted."""
    message_rules.message_count(input_count, config.max_input_messages, "input")
    if tool_count > config.max_tools:
        raise invalid_argument("INVALID_TOOLS", f"at most {config.max_tools} tools", field="tools")


def check_turn(turn: Turn, config: AgentConfig) -> None:
    """Every rule of a turn request that can be checked without reading anything."""
    validation.namespace(turn.namespace)
    if turn.conversation_id or not turn.create_if_missing:
        validation.conversation_id(turn.conversation_id)
    validation.request_id(turn.turn_id, "turn_id")
    if not turn.input:
        raise invalid_argument("NO_INPUT", "input must not be empty", field="input")
    if len(turn.input) > config.max_input_messages:
        raise invalid_argument(
            "TOO_MANY_MESSAGES",
            f"input carries at most {config.max_input_messages} messages",
            field="input",
        )
    size = 0
    for index, message in enumerate(turn.input):
        field = f"input[{index}]"
        # A system message is refused by the message rules (SYSTEM_ROLE_NOT_ALLOWED).
        if message.role not in (Role.USER, Role.TOOL, Role.SYSTEM):
            raise invalid_argument(
                "INVALID_INPUT_ROLE",
                "input holds user messages or tool results",
                field=f"{field}.role",
            )
        size += message_rules.stored_message(message, field, config.messages)
    message_rules.messages_size(size, "input", max_bytes=config.max_input_bytes)
    validation.text(
        turn.system_instructions,
        "system_instructions",
        max_bytes=config.max_system_instructions_bytes,
        reason="INVALID_SYSTEM_INSTRUCTIONS",
    )
    check_tools(turn.tools, config)


def check_tools(tools: Sequence[ToolDefinition], config: AgentConfig) -> None:
    """Tool definitions: unique names the model can call, JSON-object schemas, sizes."""
    if len(tools) > config.max_tools:
        raise invalid_argument("INVALID_TOOLS", f"at most {config.max_tools} tools", field="tools")
    names: set[str] = set()
    for index, tool in enumerate(tools):
        field = f"tools[{index}]"
        if not _TOOL_NAME.fullmatch(tool.name) or tool.name in names:
            raise invalid_argument(
                "INVALID_TOOLS",
                "tool names are unique, 1..64 characters of [A-Za-z0-9_-]",
                field=f"{field}.name",
            )
        names.add(tool.name)
        validation.text(
            tool.parameters_json_schema,
            f"{field}.parameters_json_schema",
            max_bytes=config.max_tool_schema_bytes,
            reason="INVALID_TOOLS",
        )
        if tool.parameters_json_schema:
            # The rule of every JSON field a client sends (PostgreSQL's jsonb's), though
            # this one is only passed to the model.
            validation.json_object(
                tool.parameters_json_schema,
                f"{field}.parameters_json_schema",
                "INVALID_TOOLS",
                max_depth=config.messages.max_json_depth,
            )
        validation.text(
            tool.description,
            f"{field}.description",
            max_bytes=_MAX_TOOL_DESCRIPTION_BYTES,
            reason="INVALID_TOOLS",
        )
