"""A repeat of a turn that already committed: its stored outcome, without a model call."""

from __future__ import annotations

from services.agent import metrics
from services.agent.model import ContextReport, Outcome, PriorAppend, Turn, TurnResult
from services.agent.ports import Transcripts
from services.common.domain import Role, canonical_json
from services.common.errors import invalid_argument


async def replay(
    transcripts: Transcripts, turn: Turn, conversation_id: str, prior: PriorAppend
) -> TurnResult:
    """The stored outcome of a turn that already committed (no model call); TURN_ID_REUSED
    when the stored input is not this turn's."""
    entries = await transcripts.entries(
        turn.namespace, conversation_id, prior.first_sequence, prior.last_sequence
    )
    stored = [entry.message for entry in entries]
    count = len(turn.input)
    if canonical_json(stored[:count]) != canonical_json(turn.input):
        raise invalid_argument(
            "TURN_ID_REUSED",
            "turn_id was already used for a turn with different input",
            field="turn_id",
        )
    output = stored[count:]
    calls = next((m.tool_calls for m in reversed(output) if m.role == Role.ASSISTANT), ())
    metrics.TURNS.labels("replayed").inc()
    return TurnResult(
        conversation_id=conversation_id,
        conversation_version=prior.version,
        first_sequence=prior.first_sequence,
        last_sequence=prior.last_sequence,
        outcome=Outcome(output, prior.usage),
        tool_calls=calls,
        context=ContextReport(),
        replayed=True,
    )
