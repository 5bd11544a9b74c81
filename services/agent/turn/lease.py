"""A turn's lease as the orchestrator holds it: renewals while the turn runs, and the
errors of a turn that ended without committing (rebuilt from what TranscriptService kept)."""

from __future__ import annotations

import asyncio
import logging

from services.agent.model import (
    EndedState,
    ModelOutputInvalid,
    Outcome,
    Turn,
    TurnConflict,
    TurnNotCommitted,
)
from services.agent.ports import Transcripts
from services.common.background import cancel_and_wait
from services.common.errors import DomainError, aborted

log = logging.getLogger(__name__)


def ended_error(ended: EndedState) -> DomainError:
    """The error a turn ended with, rebuilt from the outcome TranscriptService kept."""
    outcome = Outcome(ended.output, ended.usage)
    if ended.reason == "MODEL_OUTPUT_INVALID":
        violations = ended.metadata.get("violations", "")
        return ModelOutputInvalid(outcome, violations.split("\n") if violations else [])
    if ended.reason == "TURN_CONFLICT":
        return TurnConflict(
            outcome,
            int(ended.metadata.get("current_version", "0")),
            int(ended.metadata.get("expected_version", "0")),
        )
    metadata = dict(ended.metadata)
    current = int(metadata.pop("current_version", "0"))
    expected = int(metadata.pop("expected_version", "0"))
    if ended.reason == "TURN_INTERRUPTED":
        return TurnNotCommitted(
            ended.reason,
            "the turn's model call began under a lease that lapsed before the turn committed "
            "(its agent stopped or was cut off): its outcome is unknown, and it is never run "
            "again under this turn_id; send the input again under a new turn_id",
            outcome,
            current,
            expected,
            **metadata,
        )
    return TurnNotCommitted(
        ended.reason,
        "the turn ended earlier without committing; its completed outcome is attached",
        outcome,
        current,
        expected,
        **metadata,
    )


def ended_state(error: DomainError, outcome: Outcome) -> EndedState:
    return EndedState(outcome.output, outcome.usage, error.reason, dict(error.metadata))


class LeaseKeeper:
    """Renews a turn lease every third of its duration until stopped or lost."""

    def __init__(
        self, transcripts: Transcripts, turn: Turn, conversation_id: str, turn_id: str, token: int
    ) -> None:
        self._transcripts = transcripts
        self._lease = (turn.namespace, conversation_id, turn_id, token)
        self.lost = False
        # The outcome of the turn's model call, once it has one (kept if it cannot commit),
        # and whether the call failed without an answer (the turn may then run again).
        self.outcome: Outcome | None = None
        self.model_call_failed = False
        self._task: asyncio.Task[None] | None = None

    def start(self, ttl_s: float) -> None:
        self._task = asyncio.create_task(self._loop(ttl_s), name="turn-lease")

    async def _loop(self, ttl_s: float) -> None:
        while True:
            await asyncio.sleep(ttl_s / 3)
            try:
                await self._transcripts.renew_lease(*self._lease, ttl_s)
            except DomainError as error:
                if error.reason == "TURN_LEASE_LOST":
                    self.lost = True
                    log.warning("turn lease lost")
                    return
                # A blip: the lease may still hold; the next renewal tries again.

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)


def lease_lost() -> DomainError:
    return aborted("TURN_LEASE_LOST", "the turn's lease lapsed while it ran; it did not commit")
