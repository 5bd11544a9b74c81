"""Turn leases: one model call per turn id, exclusive and queued turns (TranscriptService).

The rule that decides a lease is model.decide_lease, applied by the store while
it holds the conversation; this layer validates requests and waits: for a
running turn of the same id, or for the turns ahead in a queue, woken by a
release in this process or, for a release through another replica, by a poll
(RUNIFOLD_TURN_WAIT_POLL_S). Knows nothing of gRPC or SQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
import weakref
from dataclasses import replace

from services.common import messages as message_rules
from services.common import validation
from services.common.deadlines import deadline_exceeded, deadline_var
from services.common.errors import DomainError, invalid_argument
from services.common.validation import conversation_id
from services.transcript import metrics
from services.transcript.config import TranscriptLimits
from services.transcript.model import (
    AppendRecord,
    EndedTurn,
    LeaseAttempt,
    LeaseMode,
    LeaseRequest,
    TurnLease,
    Waiting,
    turn_lease_lost,
)
from services.transcript.store import TranscriptStore

# Turn lease durations: 0 means the default; renewals keep a running turn's lease.
DEFAULT_LEASE_TTL_S = 30.0
LEASE_TTL_RANGE_S = (1.0, 600.0)
_MAX_PAYLOAD_HASH_BYTES = 64


class TurnLeases:
    """Takes, renews and releases turn leases; waits for them."""

    def __init__(self, store: TranscriptStore, limits: TranscriptLimits) -> None:
        self.store = store
        self.limits = limits
        # Turns waiting in this process, woken when a lease of their conversation
        # ends here; a release through another replica is seen at the next poll.
        self._wakeups: weakref.WeakValueDictionary[tuple[str, uuid.UUID], asyncio.Event] = (
            weakref.WeakValueDictionary()
        )

    def _wakeup(self, key: tuple[str, uuid.UUID]) -> asyncio.Event:
        event = self._wakeups.get(key)
        if event is None:
            event = asyncio.Event()
            self._wakeups[key] = event
        return event

    def _wake(self, key: tuple[str, uuid.UUID]) -> None:
        event = self._wakeups.pop(key, None)
        if event is not None:
            event.set()

    async def acquire_turn_lease(
        self,
        namespace: str,
        conversation_id_text: str,
        turn_id_text: str,
        mode: int,
        ttl_s: float,
        payload_hash: bytes,
        create_if_missing: bool,
    ) -> TurnLease | AppendRecord | EndedTurn:
        """Take a turn lease, or return the outcome of a turn id that already ran.

        A turn id that committed returns its append record; one that ended
        without committing after its model work returns that outcome; one that
        is running (or waiting) is waited for, then answered the same way. Then
        the mode: SHARED is granted at once; EXCLUSIVE is ABORTED /
        CONVERSATION_BUSY while another turn runs or waits; QUEUED waits its turn
        (first come, first served, at most `turn_queue_depth` waiting, else
        RESOURCE_EXHAUSTED / TURN_QUEUE_FULL). Waits end with the caller's
        deadline (at most RUNIFOLD_TURN_WAIT_MAX_S); a caller that leaves gives
        up its place.
        """
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        turn_id = validation.request_id(turn_id_text, "turn_id")
        if turn_id is None:
            raise invalid_argument("INVALID_TURN_ID", "turn_id is required", field="turn_id")
        if mode not in (0, *LeaseMode):
            raise invalid_argument("INVALID_LEASE_MODE", "mode is unknown", field="mode")
        if len(payload_hash) > _MAX_PAYLOAD_HASH_BYTES:
            raise invalid_argument(
                "INVALID_PAYLOAD_HASH",
                f"payload_hash is at most {_MAX_PAYLOAD_HASH_BYTES} bytes",
                field="payload_hash",
            )
        request = LeaseRequest(
            namespace,
            cid,
            turn_id,
            LeaseMode(mode or LeaseMode.SHARED),
            _lease_ttl(ttl_s),
            payload_hash,
            create_if_missing,
            self.limits.turn_queue_depth,
        )
        key = (namespace, cid)
        deadline = time.monotonic() + self.limits.turn_wait_max_s
        inbound = deadline_var.get()
        if inbound is not None:
            deadline = min(deadline, inbound)
        waiting: str | None = None
        ticket: int | None = None
        try:
            while True:
                wakeup = self._wakeup(key)  # before the attempt: a release during it counts
                attempt: LeaseAttempt = await self.store.acquire_turn(request)
                if not isinstance(attempt, Waiting):
                    return attempt
                why = "same_turn" if attempt.same_turn else "queue"
                if why != waiting:
                    if waiting is not None:
                        metrics.TURNS_WAITING.labels(waiting).dec()
                    metrics.TURNS_WAITING.labels(why).inc()
                    waiting = why
                if attempt.ticket is not None and attempt.ticket != ticket:
                    ticket = attempt.ticket
                    request = replace(request, ticket=ticket)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise deadline_exceeded("the turn waited until its deadline for a lease")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wakeup.wait(), min(left, self.limits.turn_wait_poll_s))
        except DomainError as error:
            if error.reason == "CONVERSATION_BUSY":
                metrics.TURN_BUSY_REFUSALS.labels("lease").inc()
            elif error.reason == "TURN_QUEUE_FULL":
                metrics.TURN_QUEUE_FULL.inc()
            await self._leave(namespace, cid, turn_id, ticket)
            raise
        except BaseException:
            await self._leave(namespace, cid, turn_id, ticket)
            raise
        finally:
            if waiting is not None:
                metrics.TURNS_WAITING.labels(waiting).dec()

    async def _leave(
        self, namespace: str, cid: uuid.UUID, turn_id: str, ticket: int | None
    ) -> None:
        """The caller left the queue (deadline, cancellation, failure): give up the place."""
        if ticket is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.store.leave_queue(namespace, cid, turn_id, ticket))
            self._wake((namespace, cid))

    async def renew_turn_lease(
        self,
        namespace: str,
        conversation_id_text: str,
        turn_id_text: str,
        fencing_token: int,
        ttl_s: float,
    ) -> TurnLease:
        """Extend a lease the caller holds; ABORTED / TURN_LEASE_LOST when it lapsed."""
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        turn_id = validation.request_id(turn_id_text, "turn_id") or ""
        lease = await self.store.renew_turn(
            namespace, cid, turn_id, fencing_token, _lease_ttl(ttl_s)
        )
        if lease is None:
            raise turn_lease_lost()
        return lease

    async def release_turn_lease(
        self,
        namespace: str,
        conversation_id_text: str,
        turn_id_text: str,
        fencing_token: int,
        ended: EndedTurn | None,
    ) -> bool:
        """End a lease without an append; with `ended`, keep the turn's outcome so that a
        repeat of its id returns it. False when the lease was no longer held."""
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        turn_id = validation.request_id(turn_id_text, "turn_id") or ""
        if ended is not None:
            validation.text(ended.reason, "ended.reason", max_bytes=128, reason="INVALID_OUTCOME")
            validation.metadata(ended.metadata, "ended.metadata")
            for index, message in enumerate(ended.output):
                message_rules.kept_message(
                    message, f"ended.output[{index}]", max_json_depth=self.limits.max_json_depth
                )
        released = await self.store.release_turn(
            namespace,
            cid,
            turn_id,
            fencing_token,
            ended,
            self.limits.turn_outcome_retention_s,
        )
        self._wake((namespace, cid))
        return released

    def appended(self, namespace: str, conversation_id_text: str) -> None:
        """An append committed here (it may have ended a lease): wake local waiters."""
        with contextlib.suppress(DomainError):
            self._wake((namespace, conversation_id(conversation_id_text)))


def _lease_ttl(ttl_s: float) -> float:
    """A lease duration: 0 means the default, else within LEASE_TTL_RANGE_S."""
    if ttl_s == 0:
        return DEFAULT_LEASE_TTL_S
    low, high = LEASE_TTL_RANGE_S
    if not low <= ttl_s <= high:
        raise invalid_argument(
            "INVALID_LEASE_TTL", f"ttl must be {low:g} s to {high:g} s", field="ttl"
        )
    return ttl_s
