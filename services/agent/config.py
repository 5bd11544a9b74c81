"""AgentService configuration, from environment variables (see docs/agent.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from services.common.domain import Budget
from services.common.messages import MessageLimits
from services.common.settings import Env, env_float, env_int
from services.common.validation import SUMMARY_BATCH_RANGE, WINDOW_RANGE
from services.llm.settings import ModelSettings, model_settings

# The agent model with nothing set: its offline default.
DEFAULT_CHAT_MODEL = model_settings({}, "agent")

# The budget a turn gets where its Budget fields are 0.
DEFAULT_BUDGET = Budget(max_output_tokens=4096, max_model_calls=8, max_input_tokens=200_000)


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
        )
