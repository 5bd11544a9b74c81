"""SummaryService configuration, from environment variables (documented in docs/summary.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from services.common.domain import Budget
from services.common.settings import Env, SettingsError, env_float, env_int
from services.common.validation import SUMMARY_PASSES_RANGE
from services.llm.settings import ModelSettings, model_settings

# The summary model with nothing set: its offline default.
DEFAULT_CHAT_MODEL = model_settings({}, "summary")

# The contract's ceiling on a summary (CommitSummaryRequest.text: 1 byte to 64 KiB).
MAX_SUMMARY_BYTES = 64 * 1024

# The budget a request gets where its Budget fields are 0.
DEFAULT_BUDGET = Budget(max_output_tokens=65_536, max_model_calls=64, max_input_tokens=2_000_000)


@dataclass(frozen=True)
class SummaryConfig:
    """Everything SummaryService reads from the environment, read once."""

    # -- summaries and the summarizer ---------------------------------------------
    # The summarizer's model (RUNIFOLD_SUMMARY_MODEL_*, RUNIFOLD_MODEL_*); no URL: the
    # offline digest.
    chat_model: ModelSettings = DEFAULT_CHAT_MODEL
    max_summary_bytes: int = MAX_SUMMARY_BYTES
    max_output_tokens_per_pass: int = 1024
    max_entry_chars: int = 4000
    history_limit: int = 64
    default_budget: Budget = DEFAULT_BUDGET
    # -- outbound calls to TranscriptService ---------------------------------------
    peer_timeout_s: float = 10.0
    # -- background queue -----------------------------------------------------------
    workers: int = 1
    worker_max_passes: int = 16
    worker_rounds: int = 8
    job_timeout_s: float = 300.0
    poll_interval_s: float = 1.0
    lease_s: float = 60.0
    max_failures: int = 5
    backoff_base_s: float = 2.0
    backoff_max_s: float = 300.0
    gauge_interval_s: float = 5.0
    job_retention_s: float = 7 * 24 * 3600.0

    @classmethod
    def from_env(cls, env: Env | None = None) -> SummaryConfig:
        """Read every variable once; raise SettingsError naming a bad one."""
        env = os.environ if env is None else env
        config = cls(
            chat_model=model_settings(env, "summary"),
            max_summary_bytes=env_int(
                env,
                "RUNIFOLD_SUMMARY_MAX_BYTES",
                MAX_SUMMARY_BYTES,
                minimum=256,
                maximum=MAX_SUMMARY_BYTES,
            ),
            max_output_tokens_per_pass=env_int(
                env,
                "RUNIFOLD_SUMMARY_MAX_OUTPUT_TOKENS_PER_PASS",
                1024,
                minimum=16,
                maximum=65_536,
            ),
            max_entry_chars=env_int(
                env, "RUNIFOLD_SUMMARY_MAX_ENTRY_CHARS", 4000, minimum=64, maximum=1_000_000
            ),
            history_limit=env_int(
                env, "RUNIFOLD_SUMMARY_HISTORY_LIMIT", 64, minimum=1, maximum=100_000
            ),
            default_budget=Budget(
                max_model_calls=env_int(
                    env, "RUNIFOLD_SUMMARY_DEFAULT_MAX_MODEL_CALLS", 64, minimum=1, maximum=100_000
                ),
                max_output_tokens=env_int(
                    env, "RUNIFOLD_SUMMARY_DEFAULT_MAX_OUTPUT_TOKENS", 65_536, minimum=16
                ),
                max_input_tokens=env_int(
                    env, "RUNIFOLD_SUMMARY_DEFAULT_MAX_INPUT_TOKENS", 2_000_000, minimum=16
                ),
            ),
            peer_timeout_s=env_float(env, "RUNIFOLD_SUMMARY_PEER_TIMEOUT_S", 10.0, minimum=0.1),
            workers=env_int(env, "RUNIFOLD_SUMMARY_WORKERS", 1, minimum=0, maximum=64),
            worker_max_passes=env_int(
                env,
                "RUNIFOLD_SUMMARY_WORKER_MAX_PASSES",
                16,
                minimum=1,
                maximum=SUMMARY_PASSES_RANGE[1],
            ),
            worker_rounds=env_int(
                env, "RUNIFOLD_SUMMARY_WORKER_ROUNDS", 8, minimum=1, maximum=1000
            ),
            job_timeout_s=env_float(env, "RUNIFOLD_SUMMARY_JOB_TIMEOUT_S", 300.0, minimum=1.0),
            poll_interval_s=env_float(env, "RUNIFOLD_SUMMARY_POLL_INTERVAL_S", 1.0, minimum=0.01),
            lease_s=env_float(env, "RUNIFOLD_SUMMARY_JOB_LEASE_S", 60.0, minimum=0.5),
            max_failures=env_int(
                env, "RUNIFOLD_SUMMARY_JOB_MAX_FAILURES", 5, minimum=1, maximum=1000
            ),
            backoff_base_s=env_float(env, "RUNIFOLD_SUMMARY_JOB_BACKOFF_S", 2.0, minimum=0.0),
            backoff_max_s=env_float(env, "RUNIFOLD_SUMMARY_JOB_BACKOFF_MAX_S", 300.0, minimum=0.0),
            gauge_interval_s=env_float(env, "RUNIFOLD_SUMMARY_GAUGE_INTERVAL_S", 5.0, minimum=0.05),
            job_retention_s=env_float(
                env, "RUNIFOLD_SUMMARY_JOB_RETENTION_S", 7 * 24 * 3600.0, minimum=1.0
            ),
        )
        if config.backoff_max_s < config.backoff_base_s:
            raise SettingsError(
                "RUNIFOLD_SUMMARY_JOB_BACKOFF_MAX_S must be at least RUNIFOLD_SUMMARY_JOB_BACKOFF_S"
            )
        return config
