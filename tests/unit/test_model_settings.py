"""The OpenAI-compatible base URLs of the three services that call a model are read by
one rule (services/llm/settings.py): http(s) only, refused at start naming the variable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from services.agent.config import AgentConfig
from services.common.settings import SettingsError
from services.memory.config import MemoryConfig
from services.summary.config import SummaryConfig

CONFIGS: list[tuple[Callable[[dict[str, str]], Any], str, str]] = [
    (AgentConfig.from_env, "RUNIFOLD_OPENAI_BASE_URL", "openai_base_url"),
    (SummaryConfig.from_env, "RUNIFOLD_SUMMARY_MODEL_URL", "model_base_url"),
    (MemoryConfig.from_env, "RUNIFOLD_MEMORY_PROPOSER_MODEL_URL", "proposer_model_url"),
]


@pytest.mark.parametrize(("read", "variable", "attribute"), CONFIGS)
@pytest.mark.parametrize("url", ["localhost:8080/v1", "ftp://models.example/v1", "file:///v1"])
def test_a_model_url_that_is_not_http_stops_the_start(
    read: Callable[[dict[str, str]], Any], variable: str, attribute: str, url: str
) -> None:
    with pytest.raises(SettingsError, match=variable):
        read({variable: url})


@pytest.mark.parametrize(("read", "variable", "attribute"), CONFIGS)
def test_a_model_url_is_openais_by_default_and_any_http_one_when_set(
    read: Callable[[dict[str, str]], Any], variable: str, attribute: str
) -> None:
    assert getattr(read({}), attribute) == "https://api.openai.com/v1"
    assert getattr(read({variable: "http://127.0.0.1:8000/v1"}), attribute) == (
        "http://127.0.0.1:8000/v1"
    )
