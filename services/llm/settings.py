"""The model client's settings, as each service reads them from its environment.

Each service names its own variables (RUNIFOLD_SUMMARY_MODEL_*, RUNIFOLD_AGENT_MODEL_*,
RUNIFOLD_MEMORY_PROPOSER_MODEL_*); what a value may be (its bounds, the fallback key,
the URL's scheme) is the client's rule (openai.py), so it is written here once.
"""

from __future__ import annotations

from services.common.settings import Env, SettingsError, env_float, env_int, env_str

OPENAI_BASE_URL = "https://api.openai.com/v1"


def env_model_url(env: Env, name: str) -> str:
    """An OpenAI-compatible base URL (OpenAI's by default); it must be http(s)."""
    url = env_str(env, name, OPENAI_BASE_URL)
    if not url.startswith(("http://", "https://")):
        raise SettingsError(f"{name} must be an http(s) URL, got {url!r}")
    return url


def env_model_api_key(env: Env, name: str) -> str:
    """The model's API key: the service's own variable, else OPENAI_API_KEY, else empty."""
    return env_str(env, name, env_str(env, "OPENAI_API_KEY", ""))


def env_model_timeout_s(env: Env, name: str, default: float) -> float:
    """The deadline of one model call, in seconds (at least 0.1)."""
    return env_float(env, name, default, minimum=0.1)


def env_model_max_retries(env: Env, name: str) -> int:
    """How often a failed model call is retried (0 to 10, 2 by default)."""
    return env_int(env, name, 2, minimum=0, maximum=10)


def env_model_max_concurrent(env: Env, name: str) -> int:
    """The model calls one client has in flight at most (1 to 4096, 64 by default)."""
    return env_int(env, name, 64, minimum=1, maximum=4096)


def env_model_max_queued(env: Env, name: str) -> int:
    """The model calls one client lets wait for a slot at most (256 by default)."""
    return env_int(env, name, 256, minimum=0, maximum=1_000_000)
