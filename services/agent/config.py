"""AgentService configuration, from environment variables (see docs/agent.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from services.agent.model import CurationMode
from services.common.domain import Budget
from services.common.messages import MessageLimits
from services.common.settings import Env, SettingsError, env_choice, env_float, env_int, env_str
from services.common.validation import NAMESPACE_PATTERN, SUMMARY_BATCH_RANGE, WINDOW_RANGE
from services.llm.settings import ModelSettings, model_settings

# The agent model with nothing set: its offline default.
DEFAULT_CHAT_MODEL = model_settings({}, "agent")

# The budget a turn gets where its Budget fields are 0.
DEFAULT_BUDGET = Budget(max_output_tokens=4096, max_model_calls=8, max_input_tokens=200_000)

_CURATION_MODES = {"auto": CurationMode.AUTO, "off": CurationMode.OFF}


def parse_curation_namespaces(name: str, raw: str) -> dict[str, CurationMode]:
    """`ns-a=auto,ns-b=off`: the curation default of some namespaces."""
    modes: dict[str, CurationMode] = {}
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not NAMESPACE_PATTERN.fullmatch(key) or value not in _CURATION_MODES:
            raise SettingsError(f"{name} must be namespace=auto|off pairs, got {item!r}")
        modes[key] = _CURATION_MODES[value]
    return modes


@dataclass(frozen=True)
class AgentConfig:
    """Defaults and limits of a turn, and the chat model."""

    default_window: int = 16
    default_summary_batch: int = 64
    # How far ahead of the window the background queue keeps a conversation's summary,
    # in entries (0: no job ahead; summaries only when a turn needs one). See
    # docs/summary.md, "Summaries that stay ahead".
    summary_lead: int = 8
    default_budget: Budget = DEFAULT_BUDGET
    max_input_messages: int = 64
    max_input_bytes: int = 1024 * 1024
    # The transcript's own limits (the same RUNIFOLD_MAX_* variables): the input is
    # checked against them before the model call (a message the append would refuse
    # never costs one), the model's reply before the append (MODEL_OUTPUT_INVALID).
    messages: MessageLimits = field(default_factory=MessageLimits)
    max_tool_schema_bytes: int = 64 * 1024
    max_system_instructions_bytes: int = 64 * 1024
    max_tools: int = 64
    # The agent's model (RUNIFOLD_AGENT_MODEL_*, RUNIFOLD_MODEL_*); no URL: the offline one.
    chat_model: ModelSettings = DEFAULT_CHAT_MODEL
    # Turn leases: their duration (renewed every third of it while the turn runs).
    turn_lease_ttl_s: float = 30.0
    # The longest a turn waits for its lease (ENQUEUE) when the caller set no earlier
    # deadline: the same RUNIFOLD_TURN_WAIT_MAX_S as TranscriptService's.
    turn_wait_max_s: float = 600.0
    # The curation of a turn whose policy names none (RUNIFOLD_CURATION): None until the
    # server starts, which decides it when unset: on (AUTO) in the all-in-one server, so
    # that a newcomer sees memory fill; off in a service deployed alone.
    curation_default: CurationMode | None = None
    # Namespaces with another default (RUNIFOLD_CURATION_NAMESPACES).
    curation_namespaces: Mapping[str, CurationMode] = field(default_factory=dict)
    # Curation requests in flight at most in this process (each a short call to
    # MemoryService after a turn); beyond, a request is dropped (and counted).
    curation_max_in_flight: int = 256

    def curation_for(self, namespace: str) -> CurationMode:
        """The curation of a turn of `namespace` whose policy names none."""
        if namespace in self.curation_namespaces:
            return self.curation_namespaces[namespace]
        return self.curation_default or CurationMode.OFF

    @classmethod
    def from_env(cls, env: Env | None = None) -> AgentConfig:
        env = os.environ if env is None else env
        return cls(
            default_window=env_int(
                env, "RUNIFOLD_AGENT_DEFAULT_WINDOW", 16, minimum=1, maximum=WINDOW_RANGE[1]
            ),
            default_summary_batch=env_int(
                env,
                "RUNIFOLD_AGENT_DEFAULT_SUMMARY_BATCH",
                64,
                minimum=1,
                maximum=SUMMARY_BATCH_RANGE[1],
            ),
            summary_lead=env_int(
                env, "RUNIFOLD_AGENT_SUMMARY_LEAD", 8, minimum=0, maximum=WINDOW_RANGE[1] // 2
            ),
            default_budget=Budget(
                max_output_tokens=env_int(
                    env, "RUNIFOLD_AGENT_DEFAULT_MAX_OUTPUT_TOKENS", 4096, minimum=1
                ),
                max_model_calls=env_int(
                    env, "RUNIFOLD_AGENT_DEFAULT_MAX_MODEL_CALLS", 8, minimum=1, maximum=1000
                ),
                max_input_tokens=env_int(
                    env, "RUNIFOLD_AGENT_DEFAULT_MAX_INPUT_TOKENS", 200_000, minimum=1
                ),
            ),
            max_input_messages=env_int(env, "RUNIFOLD_AGENT_MAX_INPUT_MESSAGES", 64, minimum=1),
            messages=MessageLimits.from_env(env),
            max_input_bytes=env_int(
                env, "RUNIFOLD_AGENT_MAX_INPUT_BYTES", 1024 * 1024, minimum=1024
            ),
            chat_model=model_settings(env, "agent"),
            turn_lease_ttl_s=env_float(
                env, "RUNIFOLD_AGENT_TURN_LEASE_TTL_S", 30.0, minimum=1.0, maximum=600.0
            ),
            turn_wait_max_s=env_float(
                env, "RUNIFOLD_TURN_WAIT_MAX_S", 600.0, minimum=1.0, maximum=3600.0
            ),
            curation_default=(
                _CURATION_MODES[env_choice(env, "RUNIFOLD_CURATION", "auto", ("auto", "off"))]
                if env_str(env, "RUNIFOLD_CURATION", "")
                else None
            ),
            curation_namespaces=parse_curation_namespaces(
                "RUNIFOLD_CURATION_NAMESPACES", env_str(env, "RUNIFOLD_CURATION_NAMESPACES", "")
            ),
            curation_max_in_flight=env_int(
                env, "RUNIFOLD_CURATION_MAX_REQUESTS_IN_FLIGHT", 256, minimum=1, maximum=100_000
            ),
        )
