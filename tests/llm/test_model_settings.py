"""The chat model settings of the three roles that call one (services/llm/settings.py):
one shared URL, name and key, each role's own variables over them, a URL alone switching
a role, today's names still working with a warning, and bad values named."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from services.agent.component import make_model
from services.agent.config import AgentConfig
from services.agent.offline import OfflineChatModel
from services.common.settings import SettingsError
from services.llm import settings
from services.llm.openai import OpenAIChatModel
from services.llm.settings import OPENAI_BASE_URL, ModelSettings, model_settings
from services.memory.component import build_proposer
from services.memory.config import MemoryConfig
from services.summary.component import build_summarizer
from services.summary.config import SummaryConfig

ROLES = ["agent", "summary", "curator"]
PREFIX = {"agent": "RUNIFOLD_AGENT_MODEL", "summary": "RUNIFOLD_SUMMARY_MODEL"}
PREFIX["curator"] = "RUNIFOLD_CURATOR_MODEL"
# Each service's configuration, and the role it reads.
CONFIGS: list[tuple[Callable[[dict[str, str]], Any], str]] = [
    (AgentConfig.from_env, "agent"),
    (SummaryConfig.from_env, "summary"),
    (MemoryConfig.from_env, "curator"),
]
SHARED = "http://shared.example/v1"
OWN = "http://own.example/v1"


@pytest.fixture(autouse=True)
def warn_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the deprecation warnings of its own reads (one per process)."""
    monkeypatch.setattr(settings, "_warned", set())


def deprecations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == settings.__name__ and r.levelno == logging.WARNING
    ]


# -- the offline default, and a URL alone ---------------------------------------------


@pytest.mark.parametrize(("read", "role"), CONFIGS)
def test_with_no_url_anywhere_each_role_keeps_its_offline_default(
    read: Callable[[dict[str, str]], Any], role: str
) -> None:
    chat = read({"RUNIFOLD_MODEL_NAME": "big-model", "RUNIFOLD_MODEL_API_KEY": "sk"}).chat_model
    assert chat.offline and chat.url == ""
    assert chat == read({}).chat_model == type(read({}))().chat_model


@pytest.mark.parametrize(("read", "role"), CONFIGS)
def test_a_url_alone_switches_a_role_to_that_model(
    read: Callable[[dict[str, str]], Any], role: str
) -> None:
    own = read({f"{PREFIX[role]}_URL": OWN}).chat_model
    assert (own.offline, own.url, own.name) == (False, OWN, "gpt-4o-mini")
    shared = read({"RUNIFOLD_MODEL_URL": SHARED}).chat_model
    assert (shared.offline, shared.url, shared.name) == (False, SHARED, "gpt-4o-mini")


async def test_each_component_builds_the_model_its_settings_name() -> None:
    env = {"RUNIFOLD_MODEL_URL": SHARED}
    agent, agent_client = make_model(AgentConfig.from_env(env))
    summarizer, summary_client = build_summarizer(SummaryConfig.from_env(env))
    proposer, curator_client = build_proposer(MemoryConfig.from_env(env))
    try:
        assert isinstance(agent, OpenAIChatModel) and agent.purpose == "agent"
        assert (summarizer.provider, proposer.provider) == ("openai", "openai")
        assert summary_client is not None and curator_client is not None
    finally:
        for client in (agent_client, summary_client, curator_client):
            if client is not None:
                await client.aclose()
    offline, none = make_model(AgentConfig.from_env({}))
    assert isinstance(offline, OfflineChatModel) and none is None
    assert offline.model == "offline-echo"
    assert build_summarizer(SummaryConfig.from_env({}))[0].provider == "offline"
    assert build_proposer(MemoryConfig.from_env({}))[1] is None


@pytest.mark.parametrize("role", ROLES)
def test_a_role_url_of_offline_keeps_that_role_offline_beside_a_shared_model(role: str) -> None:
    env = {"RUNIFOLD_MODEL_URL": SHARED, f"{PREFIX[role]}_URL": "offline"}
    assert model_settings(env, role).offline
    others = [other for other in ROLES if other != role]
    assert [model_settings(env, other).url for other in others] == [SHARED, SHARED]


# -- precedence: the role's, then the shared, then the default -------------------------


@pytest.mark.parametrize("role", ROLES)
def test_a_role_setting_wins_over_the_shared_one_which_wins_over_the_default(role: str) -> None:
    prefix = PREFIX[role]
    shared = {
        "RUNIFOLD_MODEL_URL": SHARED,
        "RUNIFOLD_MODEL_NAME": "shared-model",
        "RUNIFOLD_MODEL_API_KEY": "sk-shared",
    }
    assert model_settings(shared, role) == ModelSettings(
        SHARED, "shared-model", "sk-shared", timeout_s=model_settings({}, role).timeout_s
    )
    own = {
        **shared,
        f"{prefix}_URL": OWN,
        f"{prefix}_NAME": "own-model",
        f"{prefix}_API_KEY": "sk-own",
        f"{prefix}_TIMEOUT_S": "7.5",
        f"{prefix}_MAX_RETRIES": "0",
        f"{prefix}_MAX_CONCURRENT": "3",
        f"{prefix}_MAX_QUEUED": "0",
    }
    assert model_settings(own, role) == ModelSettings(OWN, "own-model", "sk-own", 7.5, 0, 3, 0)
    # One setting of the role's own, the rest shared.
    named = model_settings({**shared, f"{prefix}_NAME": "own-model"}, role)
    assert (named.url, named.name, named.api_key) == (SHARED, "own-model", "sk-shared")


@pytest.mark.parametrize("role", ROLES)
def test_the_shared_key_goes_to_the_shared_url_only(role: str) -> None:
    env = {"RUNIFOLD_MODEL_URL": SHARED, "RUNIFOLD_MODEL_API_KEY": "sk-shared"}
    elsewhere = model_settings({**env, f"{PREFIX[role]}_URL": OWN}, role)
    assert (elsewhere.url, elsewhere.api_key) == (OWN, "")
    # OPENAI_API_KEY stays the last resort of any URL, as before.
    fallback = model_settings({**env, f"{PREFIX[role]}_URL": OWN, "OPENAI_API_KEY": "sk-o"}, role)
    assert fallback.api_key == "sk-o"
    assert model_settings({**env, "OPENAI_API_KEY": "sk-o"}, role).api_key == "sk-shared"


def test_each_role_has_its_own_call_timeout_by_default() -> None:
    assert [model_settings({}, role).timeout_s for role in ROLES] == [120.0, 60.0, 60.0]
    assert {
        (s.max_retries, s.max_concurrent, s.max_queued)
        for s in map(lambda role: model_settings({}, role), ROLES)
    } == {(2, 64, 256)}


def test_the_api_key_never_shows_in_a_repr() -> None:
    chat = model_settings({"RUNIFOLD_MODEL_URL": SHARED, "RUNIFOLD_MODEL_API_KEY": "sk-x"}, "agent")
    assert "sk-x" not in repr(chat) and "sk-x" not in repr(AgentConfig(chat_model=chat))


# -- today's names ---------------------------------------------------------------------

# (role, the environment of today, what it reads as, the warnings it logs)
BEFORE: list[tuple[str, dict[str, str], ModelSettings, list[str]]] = [
    (
        "agent",
        {
            "RUNIFOLD_AGENT_MODEL_PROVIDER": "openai",
            "RUNIFOLD_OPENAI_BASE_URL": OWN,
            "RUNIFOLD_OPENAI_API_KEY": "sk-agent",
            "RUNIFOLD_AGENT_MODEL": "agent-model",
            "RUNIFOLD_AGENT_MODEL_TIMEOUT_S": "30",
        },
        ModelSettings(OWN, "agent-model", "sk-agent", timeout_s=30.0),
        [
            "RUNIFOLD_OPENAI_BASE_URL is deprecated: use RUNIFOLD_AGENT_MODEL_URL",
            "RUNIFOLD_AGENT_MODEL_PROVIDER is deprecated: use RUNIFOLD_AGENT_MODEL_URL "
            "(a URL switches the role to that model)",
            "RUNIFOLD_AGENT_MODEL is deprecated: use RUNIFOLD_AGENT_MODEL_NAME",
            "RUNIFOLD_OPENAI_API_KEY is deprecated: use RUNIFOLD_AGENT_MODEL_API_KEY",
        ],
    ),
    (
        "summary",
        {
            "RUNIFOLD_SUMMARIZER": "openai",
            "RUNIFOLD_SUMMARY_MODEL_URL": OWN,
            "RUNIFOLD_SUMMARY_MODEL": "summary-model",
            "RUNIFOLD_SUMMARY_MODEL_API_KEY": "sk-summary",
        },
        ModelSettings(OWN, "summary-model", "sk-summary", timeout_s=60.0),
        [
            "RUNIFOLD_SUMMARIZER is deprecated: use RUNIFOLD_SUMMARY_MODEL_URL "
            "(a URL switches the role to that model)",
            "RUNIFOLD_SUMMARY_MODEL is deprecated: use RUNIFOLD_SUMMARY_MODEL_NAME",
        ],
    ),
    (
        "curator",
        {
            "RUNIFOLD_MEMORY_PROPOSER": "openai",
            "RUNIFOLD_MEMORY_PROPOSER_MODEL_URL": OWN,
            "RUNIFOLD_MEMORY_PROPOSER_MODEL": "curator-model",
            "RUNIFOLD_MEMORY_PROPOSER_MODEL_API_KEY": "sk-curator",
            "RUNIFOLD_MEMORY_PROPOSER_MODEL_TIMEOUT_S": "9",
            "RUNIFOLD_MEMORY_PROPOSER_MODEL_MAX_RETRIES": "1",
        },
        ModelSettings(OWN, "curator-model", "sk-curator", timeout_s=9.0, max_retries=1),
        [
            "RUNIFOLD_MEMORY_PROPOSER_MODEL_URL is deprecated: use RUNIFOLD_CURATOR_MODEL_URL",
            "RUNIFOLD_MEMORY_PROPOSER is deprecated: use RUNIFOLD_CURATOR_MODEL_URL "
            "(a URL switches the role to that model)",
            "RUNIFOLD_MEMORY_PROPOSER_MODEL is deprecated: use RUNIFOLD_CURATOR_MODEL_NAME",
            "RUNIFOLD_MEMORY_PROPOSER_MODEL_API_KEY is deprecated: use "
            "RUNIFOLD_CURATOR_MODEL_API_KEY",
            "RUNIFOLD_MEMORY_PROPOSER_MODEL_TIMEOUT_S is deprecated: use "
            "RUNIFOLD_CURATOR_MODEL_TIMEOUT_S",
            "RUNIFOLD_MEMORY_PROPOSER_MODEL_MAX_RETRIES is deprecated: use "
            "RUNIFOLD_CURATOR_MODEL_MAX_RETRIES",
        ],
    ),
]


@pytest.mark.parametrize(("role", "env", "expected", "warnings"), BEFORE)
def test_todays_names_still_work_each_with_one_warning_naming_its_replacement(
    role: str,
    env: dict[str, str],
    expected: ModelSettings,
    warnings: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger=settings.__name__):
        assert model_settings(env, role) == expected
        assert model_settings(env, role) == expected  # read again: no second warning
    assert deprecations(caplog) == warnings
    logged = "\n".join(deprecations(caplog))
    assert not any(value in logged for value in env.values() if value.startswith(("sk", "http")))


@pytest.mark.parametrize(
    ("role", "switch"),
    [
        ("agent", "RUNIFOLD_AGENT_MODEL_PROVIDER"),
        ("summary", "RUNIFOLD_SUMMARIZER"),
        ("curator", "RUNIFOLD_MEMORY_PROPOSER"),
    ],
)
def test_the_old_switch_keeps_its_meaning(role: str, switch: str) -> None:
    # `openai` and no URL: OpenAI's API, as before.
    assert model_settings({switch: "openai"}, role).url == OPENAI_BASE_URL
    # `openai` and the shared URL: the shared one.
    assert model_settings({switch: "openai", "RUNIFOLD_MODEL_URL": SHARED}, role).url == SHARED
    # `offline` keeps the role offline, whatever URL is set (as it did).
    everywhere = {"RUNIFOLD_MODEL_URL": SHARED, f"{PREFIX[role]}_URL": OWN, switch: "offline"}
    assert model_settings(everywhere, role).offline


@pytest.mark.parametrize("role", ROLES)
def test_a_role_variable_wins_over_its_old_name(
    role: str, caplog: pytest.LogCaptureFixture
) -> None:
    ((old, setting),) = [
        (old, setting) for old, setting in settings.DEPRECATED[role].items() if setting == "NAME"
    ]
    with caplog.at_level(logging.WARNING, logger=settings.__name__):
        chat = model_settings(
            {"RUNIFOLD_MODEL_URL": SHARED, old: "old-name", f"{PREFIX[role]}_NAME": "new-name"},
            role,
        )
    assert chat.name == "new-name"
    assert deprecations(caplog) == [f"{old} is deprecated: use {PREFIX[role]}_{setting}"]


# -- bad values name their variable ------------------------------------------------------

BAD: list[tuple[str, dict[str, str], str]] = [
    ("agent", {"RUNIFOLD_MODEL_URL": "localhost:8080/v1"}, "RUNIFOLD_MODEL_URL"),
    ("summary", {"RUNIFOLD_SUMMARY_MODEL_URL": "ftp://models.example/v1"}, "SUMMARY_MODEL_URL"),
    ("curator", {"RUNIFOLD_CURATOR_MODEL_URL": "file:///v1"}, "RUNIFOLD_CURATOR_MODEL_URL"),
    ("agent", {"RUNIFOLD_OPENAI_BASE_URL": "ftp://x"}, "RUNIFOLD_OPENAI_BASE_URL"),
    ("curator", {"RUNIFOLD_MEMORY_PROPOSER_MODEL_URL": "x"}, "RUNIFOLD_MEMORY_PROPOSER_MODEL_URL"),
    ("agent", {"RUNIFOLD_AGENT_MODEL_PROVIDER": "anthropic"}, "RUNIFOLD_AGENT_MODEL_PROVIDER"),
    ("summary", {"RUNIFOLD_SUMMARIZER": "gpt"}, "RUNIFOLD_SUMMARIZER"),
    ("agent", {"RUNIFOLD_AGENT_MODEL_TIMEOUT_S": "0"}, "RUNIFOLD_AGENT_MODEL_TIMEOUT_S"),
    ("summary", {"RUNIFOLD_SUMMARY_MODEL_MAX_RETRIES": "11"}, "RUNIFOLD_SUMMARY_MODEL_MAX_RETRIES"),
    ("curator", {"RUNIFOLD_CURATOR_MODEL_MAX_CONCURRENT": "0"}, "CURATOR_MODEL_MAX_CONCURRENT"),
    ("curator", {"RUNIFOLD_CURATOR_MODEL_MAX_QUEUED": "many"}, "RUNIFOLD_CURATOR_MODEL_MAX_QUEUED"),
    (
        "curator",
        {"RUNIFOLD_MEMORY_PROPOSER_MODEL_TIMEOUT_S": "-1"},
        "RUNIFOLD_MEMORY_PROPOSER_MODEL_TIMEOUT_S",
    ),
]


@pytest.mark.parametrize(("role", "env", "variable"), BAD)
def test_a_bad_value_stops_the_start_naming_its_variable(
    role: str, env: dict[str, str], variable: str
) -> None:
    with pytest.raises(SettingsError, match=variable):
        model_settings(env, role)


@pytest.mark.parametrize(("read", "role"), CONFIGS)
@pytest.mark.parametrize("url", ["localhost:8080/v1", "ftp://models.example/v1", "file:///v1"])
def test_a_model_url_that_is_not_http_stops_the_start_even_when_unused(
    read: Callable[[dict[str, str]], Any], role: str, url: str
) -> None:
    variable = f"{PREFIX[role]}_URL"
    with pytest.raises(SettingsError, match=variable):
        read({variable: url})
    # Kept offline by the old switch, a bad URL still stops the start (as before).
    switch = settings.DEPRECATED_SWITCHES[role]
    with pytest.raises(SettingsError, match="RUNIFOLD_MODEL_URL"):
        read({"RUNIFOLD_MODEL_URL": url, switch: "offline"})
