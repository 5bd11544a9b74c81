"""The chat model settings of every role that calls one, read by one function.

Three roles call a chat model: the agent (AgentService's turns), the summarizer
(SummaryService) and the curator (MemoryService's ProposeMemories). Each reads
its `ModelSettings` with `model_settings(env, role)`:

- `RUNIFOLD_MODEL_URL`, `RUNIFOLD_MODEL_NAME`, `RUNIFOLD_MODEL_API_KEY` are shared by
  every role;
- `RUNIFOLD_<ROLE>_MODEL_URL`, `_NAME`, `_API_KEY` (ROLE: AGENT, SUMMARY, CURATOR)
  override them for one role, and `_TIMEOUT_S`, `_MAX_RETRIES`, `_MAX_CONCURRENT`,
  `_MAX_QUEUED` bound its client;
- a URL alone switches a role to that model (any OpenAI-compatible endpoint); with no
  URL anywhere, or the role's URL `offline`, the role keeps its offline default;
- the shared API key is sent only to the shared URL: a role with its own URL takes
  its own key (else `OPENAI_API_KEY`, else none), never another host's.

The names used before (RUNIFOLD_AGENT_MODEL_PROVIDER, RUNIFOLD_OPENAI_BASE_URL, ...,
`DEPRECATED`) keep working: each logs one warning at start naming its replacement
(never its value). What a value may be (its bounds, the URL's scheme) is the client's
rule (openai.py), so it is written here once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from services.common.settings import Env, SettingsError, env_choice, env_float, env_int, env_str

log = logging.getLogger(__name__)

OPENAI_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL_NAME = "gpt-4o-mini"
# A role's URL that keeps the role on its offline default whatever the shared URL says.
OFFLINE = "offline"

# The roles that call a chat model, and the prefix of their own variables.
ROLES = {
    "agent": "RUNIFOLD_AGENT_MODEL",
    "summary": "RUNIFOLD_SUMMARY_MODEL",
    "curator": "RUNIFOLD_CURATOR_MODEL",
}
# The longest model call of each role by default, in seconds.
_TIMEOUTS_S = {"agent": 120.0, "summary": 60.0, "curator": 60.0}
# The name a role's offline default reports.
_OFFLINE_NAMES = {"agent": "offline-echo", "summary": OFFLINE, "curator": OFFLINE}

# The names used before this file read every role alike: the old variable, and the
# setting (the suffix of the role's variable) it now is. The role's own variable wins
# when both are set.
DEPRECATED: Mapping[str, Mapping[str, str]] = {
    "agent": {
        "RUNIFOLD_OPENAI_BASE_URL": "URL",
        "RUNIFOLD_AGENT_MODEL": "NAME",
        "RUNIFOLD_OPENAI_API_KEY": "API_KEY",
    },
    "summary": {"RUNIFOLD_SUMMARY_MODEL": "NAME"},
    "curator": {
        "RUNIFOLD_MEMORY_PROPOSER_MODEL_URL": "URL",
        "RUNIFOLD_MEMORY_PROPOSER_MODEL": "NAME",
        "RUNIFOLD_MEMORY_PROPOSER_MODEL_API_KEY": "API_KEY",
        "RUNIFOLD_MEMORY_PROPOSER_MODEL_TIMEOUT_S": "TIMEOUT_S",
        "RUNIFOLD_MEMORY_PROPOSER_MODEL_MAX_RETRIES": "MAX_RETRIES",
    },
}
# The old switches between the offline default and a model (`offline` or `openai`):
# `openai` without a URL meant OpenAI's API; `offline` keeps the role offline, whatever
# URL is set (as it did).
DEPRECATED_SWITCHES = {
    "agent": "RUNIFOLD_AGENT_MODEL_PROVIDER",
    "summary": "RUNIFOLD_SUMMARIZER",
    "curator": "RUNIFOLD_MEMORY_PROPOSER",
}

# The deprecated variables already warned about: one warning per process.
_warned: set[str] = set()


@dataclass(frozen=True)
class ModelSettings:
    """One role's chat model: where (`url`, empty for the role's offline default), which
    (`name`), with what key, and the bounds of its client."""

    url: str = ""
    name: str = DEFAULT_MODEL_NAME
    api_key: str = field(default="", repr=False)
    # The longest model call (the request's deadline may cut it shorter).
    timeout_s: float = 60.0
    # Retries of a call that failed to connect, or got HTTP 429 or 5xx.
    max_retries: int = 2
    # The queue in front of the model: calls in flight, and calls waiting, at most.
    max_concurrent: int = 64
    max_queued: int = 256

    @property
    def offline(self) -> bool:
        """True when the role uses its offline default (no URL)."""
        return not self.url


def _deprecated(old: str, replacement: str) -> None:
    if old not in _warned:
        _warned.add(old)
        log.warning("%s is deprecated: use %s", old, replacement)


def model_settings(env: Env, role: str) -> ModelSettings:
    """The chat model settings of `role` ("agent", "summary" or "curator").

    Each setting is the role's variable, else (URL, name, key) the shared one, else
    the default; a deprecated name stands for the role's variable it became. Raises
    SettingsError naming the variable whose value is bad.
    """
    prefix = ROLES[role]
    renamed = {setting: old for old, setting in DEPRECATED[role].items()}

    def source(setting: str) -> str | None:
        """The variable a role's setting is read from: its own, else its old name."""
        own = f"{prefix}_{setting}"
        old = renamed.get(setting)
        if old is not None and env_str(env, old, ""):
            _deprecated(old, own)
            if not env_str(env, own, ""):
                return old
        return own if env_str(env, own, "") else None

    # A bad URL stops the start wherever it is set, used or not.
    url_from = source("URL")
    own_url = _url(env, url_from) if url_from is not None else None
    shared_url = _url(env, "RUNIFOLD_MODEL_URL")
    switch_name = DEPRECATED_SWITCHES[role]
    switch = env_str(env, switch_name, "")
    if switch:
        switch = env_choice(env, switch_name, OFFLINE, (OFFLINE, "openai"))
        _deprecated(switch_name, f"{prefix}_URL (a URL switches the role to that model)")
    if switch == OFFLINE:
        url = ""
    elif own_url is not None:
        url = own_url
    elif shared_url is not None:
        url = shared_url
    else:
        url = OPENAI_BASE_URL if switch == "openai" else ""

    name_from = source("NAME")
    if name_from is not None:
        name = env_str(env, name_from, "")
    elif url:
        name = env_str(env, "RUNIFOLD_MODEL_NAME", DEFAULT_MODEL_NAME)
    else:
        name = _OFFLINE_NAMES[role]

    key_from = source("API_KEY")
    fallback = env_str(env, "OPENAI_API_KEY", "")
    if not url:
        api_key = ""  # the offline default calls no one
    elif key_from is not None:
        api_key = env_str(env, key_from, "")
    elif url_from is None:  # the shared URL's key goes to the shared URL only
        api_key = env_str(env, "RUNIFOLD_MODEL_API_KEY", fallback)
    else:
        api_key = fallback

    def bound(setting: str) -> str:
        return source(setting) or f"{prefix}_{setting}"

    return ModelSettings(
        url=url,
        name=name,
        api_key=api_key,
        timeout_s=env_float(env, bound("TIMEOUT_S"), _TIMEOUTS_S[role], minimum=0.1),
        max_retries=env_int(env, bound("MAX_RETRIES"), 2, minimum=0, maximum=10),
        max_concurrent=env_int(env, bound("MAX_CONCURRENT"), 64, minimum=1, maximum=4096),
        max_queued=env_int(env, bound("MAX_QUEUED"), 256, minimum=0, maximum=1_000_000),
    )


def _url(env: Env, name: str) -> str | None:
    """An OpenAI-compatible base URL, which must be http(s); "" for `offline`; None when
    the variable is unset."""
    url = env_str(env, name, "")
    if not url:
        return None
    if url.lower() == OFFLINE:
        return ""
    if not url.startswith(("http://", "https://")):
        raise SettingsError(f"{name} must be an http(s) URL or {OFFLINE}, got {url!r}")
    return url
