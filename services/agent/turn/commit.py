"""The two writes around a turn's model call: saying that it begins, and committing what
it produced.

- Before the model call, the turn renews its lease saying so (`calling_model`):
  TranscriptService records it, and from then on a lapse of the lease interrupts the
  turn (TURN_INTERRUPTED) instead of letting a repeat of its turn id take the lease over
  and run the model again. One model call per turn id, even when an agent is paused or
  cut off past its lease.
- After it, the one append (or, when it cannot commit, the release that keeps its
  outcome for repeats). A blip of TranscriptService or its database must not lose
  model work that completed: the append is retried, the same request (its request id is
  the turn id and it quotes the lease's fencing token, so a retry of one that committed
  returns that commit and a retry after the lease was lost is refused), with backoff,
  within the caller's deadline (at most `COMMIT_RETRY_S` without one).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from services.agent import metrics
from services.agent.model import AppendState, EndedState, Turn
from services.agent.ports import Transcripts
from services.agent.turn.lease import lease_lost
from services.common.backoff import backoff
from services.common.deadlines import deadline_var
from services.common.domain import Message, Usage
from services.common.errors import DomainError, StoreUnavailable

# The longest a commit is retried when the call has no deadline of its own.
COMMIT_RETRY_S = 30.0

T = TypeVar("T")


async def calling_model(
    transcripts: Transcripts,
    turn: Turn,
    conversation_id: str,
    turn_id: str,
    fencing_token: int,
    ttl_s: float,
) -> None:
    """Record that the model call begins (a renewal of the lease); TURN_LEASE_LOST, before
    any model work, when the lease was lost already."""
    try:
        await transcripts.renew_lease(
            turn.namespace, conversation_id, turn_id, fencing_token, ttl_s, calling_model=True
        )
    except DomainError as error:
        if error.reason == "TURN_LEASE_LOST":
            raise lease_lost() from None
        raise


async def _until_answered(call: Callable[[], Awaitable[T]], what: str) -> T:
    """`call`, again (the same request) while it finds TranscriptService or its store
    unavailable, with backoff, within the caller's deadline (COMMIT_RETRY_S without)."""
    deadline = deadline_var.get()
    until = time.monotonic() + COMMIT_RETRY_S
    if deadline is not None:
        until = min(until, deadline)
    attempt = 0
    while True:
        try:
            return await call()
        except StoreUnavailable:
            delay = backoff(attempt, base_s=0.1, max_s=2.0, jitter=0.5)
            if time.monotonic() + delay >= until:
                raise
            attempt += 1
            metrics.TURN_WRITE_RETRIES.labels(what).inc()
            await asyncio.sleep(delay)  # the backoff before the same request again


async def commit(
    transcripts: Transcripts,
    turn: Turn,
    conversation_id: str,
    expected_version: int,
    messages: Sequence[Message],
    turn_id: str,
    usage: Usage,
    fencing_token: int,
) -> AppendState:
    """The turn's append, retried while TranscriptService (or its store) is unavailable."""
    attempts = 0

    async def append() -> AppendState:
        nonlocal attempts
        attempts += 1
        return await transcripts.append(
            turn.namespace,
            conversation_id,
            expected_version,
            messages,
            turn_id,
            usage,
            fencing_token,
        )

    appended = await _until_answered(append, "commit")
    if attempts > 1 and appended.replayed:
        # An earlier attempt of this very call committed before its answer was lost.
        return replace(appended, replayed=False)
    return appended


async def release(
    transcripts: Transcripts,
    turn: Turn,
    conversation_id: str,
    turn_id: str,
    fencing_token: int,
    ended: EndedState | None,
    model_call_failed: bool = False,
) -> bool:
    """End the lease without an append (keeping `ended` for repeats of the turn id),
    retried like the commit: a kept outcome is not lost to a blip."""
    return await _until_answered(
        lambda: transcripts.release_lease(
            turn.namespace, conversation_id, turn_id, fencing_token, ended, model_call_failed
        ),
        "release",
    )
