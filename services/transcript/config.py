"""TranscriptService limits, from environment variables (documented in docs/transcript.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from services.common.settings import Env, env_int
from services.common.validation import MAX_MESSAGE_BYTES, MESSAGE_BYTES_RANGE


@dataclass(frozen=True)
class TranscriptLimits:
    """Explicit limits of the transcript; each breach is INVALID_ARGUMENT."""

    max_messages_per_append: int = 256
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_append_bytes: int = 4 * 1024 * 1024
    max_tool_calls_per_message: int = 64

    @property
    def tool_group_bound(self) -> int:
        """Most entries one tool call group spans: the call plus one result per call."""
        return self.max_tool_calls_per_message + 1

    @classmethod
    def from_env(cls, env: Env | None = None) -> TranscriptLimits:
        env = os.environ if env is None else env
        return cls(
            max_messages_per_append=env_int(
                env, "RUNIFOLD_MAX_MESSAGES_PER_APPEND", 256, minimum=1, maximum=4096
            ),
            max_message_bytes=env_int(
                env,
                "RUNIFOLD_MAX_MESSAGE_BYTES",
                MAX_MESSAGE_BYTES,
                minimum=MESSAGE_BYTES_RANGE[0],
                maximum=MESSAGE_BYTES_RANGE[1],
            ),
            max_append_bytes=env_int(
                env,
                "RUNIFOLD_MAX_APPEND_BYTES",
                4 * 1024 * 1024,
                minimum=1024,
                maximum=12 * 1024 * 1024,
            ),
            max_tool_calls_per_message=env_int(
                env, "RUNIFOLD_MAX_TOOL_CALLS_PER_MESSAGE", 64, minimum=1, maximum=512
            ),
        )
