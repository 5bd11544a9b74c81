"""AgentService domain logic: shapes requests, runs turns, erases conversations.

A turn (services/agent/turn/runner.py) runs atomically under a turn lease; erasure
(services/agent/erasure.py) removes a conversation and everything derived
from it. Takes ports to the other services and a ChatModel; knows nothing of
gRPC.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from services.agent import metrics
from services.agent.config import AgentConfig
from services.agent.erasure import erase, receipt
from services.agent.model import (
    ConcurrencyMode,
    CurationMode,
    Erasure,
    ModelOutputInvalid,
    Policy,
    Receipt,
    SummaryMode,
    Turn,
    TurnEvent,
    TurnNotCommitted,
    TurnResult,
)
from services.agent.ports import Memories, Summaries, Transcripts
from services.agent.turn import inputs
from services.agent.turn.curation import CurationRequests
from services.agent.turn.runner import TurnRunner
from services.common import validation
from services.common.domain import Budget
from services.common.errors import DomainError, invalid_argument
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
        self.curation = CurationRequests(memories, config.curation_max_in_flight)
        self._turns = TurnRunner(transcripts, summaries, memories, model, config, self.curation)

    # -- request shaping -----------------------------------------------------

    def policy(
        self,
        window: int,
        summary_batch: int,
        memory_limit: int,
        summary_mode: int,
        max_summary_passes: int,
        curation: int = 0,
        namespace: str = "",
    ) -> Policy:
        """A validated policy; zero fields take the documented defaults (the curation's:
        the namespace's default)."""
        window = window or self.config.default_window
        summary_batch = summary_batch or self.config.default_summary_batch
        validation.view_bounds(window, summary_batch, prefix="policy.")
        validation.in_range(
            memory_limit,
            (0, validation.MEMORY_LIMIT_RANGE[1]),
            "policy.memory_limit",
            "INVALID_MEMORY_LIMIT",
        )
        if summary_mode not in (0, SummaryMode.REQUIRE, SummaryMode.AUTO):
            raise invalid_argument(
                "INVALID_SUMMARY_MODE",
                "policy.summary_mode is unknown",
                field="policy.summary_mode",
            )
        passes = max_summary_passes or 1
        validation.in_range(
            passes,
            validation.SUMMARY_PASSES_RANGE,
            "policy.max_summary_passes",
            "INVALID_SUMMARY_PASSES",
        )
        if curation not in (0, *CurationMode):
            raise invalid_argument(
                "INVALID_CURATION_MODE", "policy.curation is unknown", field="policy.curation"
            )
        return Policy(
            window,
            summary_batch,
            memory_limit,
            SummaryMode(summary_mode or SummaryMode.REQUIRE),
            passes,
            CurationMode(curation) if curation else self.config.curation_for(namespace),
        )

    def concurrency(self, value: int) -> ConcurrencyMode:
        """The concurrency mode of a turn; 0 (unspecified) is RACE."""
        if value not in (0, *ConcurrencyMode):
            raise invalid_argument(
                "INVALID_CONCURRENCY_MODE", "concurrency is unknown", field="concurrency"
            )
        return ConcurrencyMode(value or ConcurrencyMode.RACE)

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

    async def receipt(self, namespace: str, receipt_id: str, conversation_id: str = "") -> Receipt:
        """An erasure's receipt, completed if the index caught up since (see
        services/agent/erasure.py)."""
        turns = self._turns
        return await receipt(
            turns.transcripts, turns.memories, namespace, receipt_id, conversation_id
        )
