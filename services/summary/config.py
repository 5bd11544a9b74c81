"""SummaryService configuration, from environment variables (documented in docs/summary.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from services.common.domain import Budget
from services.common.settings import Env, SettingsError, env_choice, env_float, env_int, env_str
from services.common.validation import SUMMARY_PASSES_RANGE
from services.llm.settings import (
    OPENAI_BASE_URL,
    env_model_api_key,
    env_model_max_concurrent,
    env_model_max_queued,
    env_model_max_retries,
    env_model_timeout_s,
    env_model_url,
)

# The contract's ceiling on a summary (CommitSummaryRequest.text: 1 byte to 64 KiB).
MAX_SUMMARY_BYTES = 64 * 1024

# The budget a request gets where its Budget fields are 0.
DEFAULT_BUDGET = Budget(max_output_tokens=65_536, max_model_calls=64, max_input_tokens=2_000_000)


@dataclass(frozen=True)
class SummaryConfig:
    """Everything SummaryService reads from the environment, read once."""

    # -- summaries and the summarizer ---------------------------------------------
    summarizer: str = "offline"  # "offline" or "openai"
    model_base_url: str = OPENAI_BASE_URL
    model_name: str = "gpt-4o-mini"
    model_api_key: str = ""
    model_timeout_s: float = 60.0
    model_max_retries: int = 2
    # The queue in front of the model: calls in flight, and calls waiting, at most.
    model_max_concurrent: int = 64
    model_max_queued: int = 256
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
        summarizer = env_choice(env, "RUNIFOLD_SUMMARIZER", "offline", ("offline", "openai"))
        config = cls(
            summarizer=summarizer,
            model_base_url=env_model_url(env, "RUNIFOLD_SUMMARY_MODEL_URL"),
            model_name=env_str(env, "RUNIFOLD_SUMMARY_MODEL", "gpt-4o-mini"),
            model_api_key=env_model_api_key(env, "RUNIFOLD_SUMMARY_MODEL_API_KEY"),
            model_timeout_s=env_model_timeout_s(env, "RUNIFOLD_SUMMARY_MODEL_TIMEOUT_S", 60.0),
            model_max_retries=env_model_max_retries(env, "RUNIFOLD_SUMMARY_MODEL_MAX_RETRIES"),
            model_max_concurrent=env_model_max_concurrent(
                env, "RUNIFOLD_SUMMARY_MODEL_MAX_CONCURRENT"
            ),
            model_max_queued=env_model_max_queued(env, "RUNIFOLD_SUMMARY_MODEL_MAX_QUEUED"),
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
