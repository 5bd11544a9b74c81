"""A tool schema nested beyond what the JSON parser recurses into is INVALID_TOOLS,
not an unhandled RecursionError (found by tests/system/security/test_hostile_input.py:
RunConversation answered INTERNAL)."""

from __future__ import annotations

import pytest

from services.agent.config import AgentConfig
from services.agent.turn.inputs import check_tools
from services.common.domain import ToolDefinition
from services.common.errors import DomainError


@pytest.mark.parametrize(
    "schema", ["[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000]
)
def test_deeply_nested_schema_is_invalid_tools(schema: str) -> None:
    with pytest.raises(DomainError) as caught:
        check_tools([ToolDefinition("lookup", "", schema)], AgentConfig())
    assert caught.value.reason == "INVALID_TOOLS"
    assert caught.value.field == "tools[0].parameters_json_schema"
