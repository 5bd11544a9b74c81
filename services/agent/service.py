"""AgentService domain logic: shapes requests, runs turns, erases conversations.

A turn (services/agent/turn.py) runs atomically under a turn lease; erasure
(services/agent/erasure.py) removes a conversation and everything derived
from it. Takes ports to the other services and a ChatModel; knows nothing of
gRPC.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from services.agent import inputs, metrics
from services.agent.config import AgentConfig
from services.agent.erasure import erase
from services.agent.model import (
    ConcurrencyMode,
    Erasure,
    ModelOutputInvalid,
    Policy,
    Turn,
    TurnEvent,
    TurnNotCommitted,
    TurnResult,
)
from services.agent.ports import Memories, Summaries, Transcripts
from services.agent.turn import TurnRunner
from services.common.domain import Budget
from services.common.errors import DomainError
from services.llm.model import ChatModel, with_defaults


class AgentService:
    """Runs agent turns against the transcript, summary and memory services."""

    def __init__(
        self,
        transcripts: Transcripts,
        summaries: Summaries,
        memories: Memories,
        model: ChatModel,
        config: AgentConfig,
    ) -> None:
        self.config = config
        self._turns = TurnRunner(transcripts, summaries, memories, model, config)

    # -- request shaping -----------------------------------------------------

    def policy(
        self,
        window: int,
        summary_batch: int,
        memory_limit: int,
        summary_mode: int,
        max_summary_passes: int,
    ) -> Policy:
        """A validated policy; zero fields take the documented defaults."""
        return inputs.policy(
            self.config, window, summary_batch, memory_limit, summary_mode, max_summary_passes
        )

    def concurrency(self, value: int) -> ConcurrencyMode:
        """The concurrency mode of a turn; 0 is RACE."""
        return inputs.concurrency(value)

    def budget(self, budget: Budget) -> Budget:
        """The caller's budget with server defaults for zero fields."""
        return with_defaults(budget, self.config.default_budget)

    # -- the turn --------------------------------------------------------------

    async def run(self, turn: Turn) -> TurnResult:
        """Run a turn and return its committed result."""
        result: TurnResult | None = None
        async for event in self.events(turn, stream=False):
            if isinstance(event, TurnResult):
                result = event
        if result is None:  # pragma: no cover - events always ends in a result or raises
            raise RuntimeError("turn ended without a result")
        return result

    async def events(self, turn: Turn, *, stream: bool) -> AsyncIterator[TurnEvent]:
        """The turn as events: progress, text deltas (when streaming), then the result."""
        inputs.check_turn(turn, self.config)
        try:
            async for event in self._turns.events(turn, stream):
                yield event
        except TurnNotCommitted as error:
            if error.reason == "TURN_CONFLICT":
                metrics.TURN_CONFLICTS.inc()
            metrics.TURNS.labels("conflict").inc()
            raise
        except ModelOutputInvalid:
            metrics.TURNS.labels("model_output_invalid").inc()
            raise
        except DomainError as error:
            if error.reason in {"SUMMARY_REQUIRED", "SUMMARY_BACKLOG"}:
                metrics.SUMMARY_REQUIRED.labels(error.reason).inc()
            metrics.TURNS.labels("busy" if error.reason == "CONVERSATION_BUSY" else "error").inc()
            raise

    async def erase(self, namespace: str, conversation_id: str) -> Erasure:
        """Erase a conversation everywhere (see services/agent/erasure.py)."""
        turns = self._turns  # holds the ports
        return await erase(
            turns.transcripts, turns.summaries, turns.memories, namespace, conversation_id
        )
