"""Turn leases: one model call per turn id, exclusive and queued turns (TranscriptService).

The rule that decides a lease is model.decide_lease, applied by the store while
it holds the conversation; this layer validates requests and waits: for a
running turn of the same id, or for the turns ahead in a queue.

Waiting costs no connection and no polling. A waiting call sleeps until its
conversation changes, then tries again:

- a release or an append through this process wakes the conversation's waiters
  here at once;
- one through another replica is announced with PostgreSQL's NOTIFY (the
  store marks a conversation with waiters as watched, as WatchConversation's
  streams do, so that its writes announce; services/transcript/watch/ carries
  the notifications) and wakes them too;
- the safety net: every RUNIFOLD_TURN_WAIT_POLL_S a waiter tries again unwoken
  (which also keeps its place in a queue, and notices a lease whose holder died).

The waiters of one conversation in this process try one at a time, and at most
`_RETRYING` tries run at once in the process, so that a crowd of waiters never
drains the connection pool that appends (the turn they wait for among them) need.
Waiters are bounded per conversation and per namespace in this process
(RUNIFOLD_TURN_MAX_WAITERS_PER_CONVERSATION, ..._PER_NAMESPACE): one more is
RESOURCE_EXHAUSTED / TURN_WAITERS_LIMIT with RetryInfo, its place given back.
Knows nothing of gRPC or SQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field, replace

from services.common import messages as message_rules
from services.common import metrics as common_metrics
from services.common import validation
from services.common.background import finish_regardless
from services.common.deadlines import deadline_exceeded, deadline_var
from services.common.errors import Code, DomainError, invalid_argument
from services.common.shedding import retry_delay
from services.common.validation import conversation_id
from services.transcript import metrics
from services.transcript.config import TranscriptLimits
from services.transcript.conversations.model import AppendRecord
from services.transcript.leases.model import (
    EndedTurn,
    LeaseAttempt,
    LeaseMode,
    LeaseRequest,
    TurnLease,
    Waiting,
    turn_lease_lost,
)
from services.transcript.leases.store import TurnLeaseStore

# Turn lease durations: 0 means the default; renewals keep a running turn's lease.
DEFAULT_LEASE_TTL_S = 30.0
LEASE_TTL_RANGE_S = (1.0, 600.0)
_MAX_PAYLOAD_HASH_BYTES = 64
# Tries of waiting calls running at once in this process (each one short transaction):
# a quarter of the default pool (RUNIFOLD_DB_POOL_MAX 16), the rest is for everyone else.
_RETRYING = 4

Key = tuple[str, uuid.UUID]


@dataclass(eq=False)
class _Waiters:
    """The calls of one conversation waiting in this process."""

    count: int = 0  # calls waiting (counted against the limits)
    users: int = 0  # calls that may wait: the group lives while one is in acquire
    key: int = 0  # the conversation's key, once an attempt told it
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    trying: asyncio.Lock = field(default_factory=asyncio.Lock)


def turn_waiters_limit(scope: str, limit: int) -> DomainError:
    """RESOURCE_EXHAUSTED / TURN_WAITERS_LIMIT: too many calls wait here already."""
    common_metrics.REQUESTS_SHED.labels("lease_wait", "TURN_WAITERS_LIMIT").inc()
    return DomainError(
        Code.RESOURCE_EXHAUSTED,
        "TURN_WAITERS_LIMIT",
        f"{limit} turns already wait for a lease of this {scope} here, its limit; "
        "retry after the delay in RetryInfo",
        metadata={"scope": scope, "limit": limit},
        retry_after_s=retry_delay(1.0),
    )


class TurnLeases:
    """Takes, renews and releases turn leases; waits for them."""

    def __init__(self, store: TurnLeaseStore, limits: TranscriptLimits) -> None:
        self.store = store
        self.limits = limits
        self._groups: dict[Key, _Waiters] = {}
        self._by_key: dict[int, _Waiters] = {}
        self._namespaces: dict[str, int] = {}
        self._retrying: asyncio.Semaphore | None = None

    @property
    def waiting(self) -> int:
        """Calls waiting for a lease in this process (tests and tools)."""
        return sum(self._namespaces.values())

    def _wake(self, group: _Waiters) -> None:
        woken, group.woken = group.woken, asyncio.Event()
        woken.set()

    def changed(self, key: int) -> None:
        """Conversation `key` changed (a write here, or one announced by another
        replica): its waiters here try again."""
        group = self._by_key.get(key)
        if group is not None:
            self._wake(group)

    def _join(self, key: Key) -> _Waiters:
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Waiters()
        group.users += 1
        return group

    def _part(self, key: Key, group: _Waiters) -> None:
        group.users -= 1
        if not group.users:
            del self._groups[key]  # bounded: conversations with calls in acquire
            if group.key:
                self._by_key.pop(group.key, None)

    def _count_in(self, namespace: str, group: _Waiters) -> None:
        limits = self.limits
        if group.count >= limits.turn_waiters_per_conversation:
            raise turn_waiters_limit("conversation", limits.turn_waiters_per_conversation)
        if self._namespaces.get(namespace, 0) >= limits.turn_waiters_per_namespace:
            raise turn_waiters_limit("namespace", limits.turn_waiters_per_namespace)
        group.count += 1
        self._namespaces[namespace] = self._namespaces.get(namespace, 0) + 1

    def _count_out(self, namespace: str, group: _Waiters) -> None:
        group.count -= 1
        left = self._namespaces[namespace] - 1
        if left:
            self._namespaces[namespace] = left
        else:
            del self._namespaces[namespace]  # bounded: namespaces with waiters

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
        up its place; beyond the waiter limits, RESOURCE_EXHAUSTED /
        TURN_WAITERS_LIMIT.
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
            outcome_retention_s=self.limits.turn_outcome_retention_s,
        )
        key = (namespace, cid)
        deadline = time.monotonic() + self.limits.turn_wait_max_s
        inbound = deadline_var.get()
        if inbound is not None:
            deadline = min(deadline, inbound)
        group = self._join(key)
        waiting: str | None = None
        ticket: int | None = None
        counted = False
        woken = group.woken
        try:
            while True:
                if counted:
                    cause = "woken" if woken.is_set() else "poll"
                    metrics.TURN_LEASE_RETRIES.labels(cause).inc()
                    woken = group.woken  # before the attempt: a change during it counts
                    attempt = await self._retry(group, request)
                else:
                    woken = group.woken
                    attempt = await self.store.acquire_turn(request)
                if not isinstance(attempt, Waiting):
                    return attempt
                if attempt.ticket is not None and attempt.ticket != ticket:
                    ticket = attempt.ticket
                    request = replace(request, ticket=ticket)
                if attempt.key and request.conversation_key is None:
                    # From now on the wait is for this conversation: another one made
                    # under its id after an erasure is not it.
                    request = replace(request, conversation_key=attempt.key)
                if attempt.key and not group.key:
                    group.key = attempt.key
                    self._by_key[attempt.key] = group
                if not counted:
                    self._count_in(namespace, group)
                    counted = True
                why = "same_turn" if attempt.same_turn else "queue"
                if why != waiting:
                    if waiting is not None:
                        metrics.TURNS_WAITING.labels(waiting).dec()
                    metrics.TURNS_WAITING.labels(why).inc()
                    waiting = why
                left = deadline - time.monotonic()
                if left <= 0:
                    raise deadline_exceeded("the turn waited until its deadline for a lease")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(left, self.limits.turn_wait_poll_s)):
                        await woken.wait()
        except DomainError as error:
            if error.reason == "CONVERSATION_BUSY":
                metrics.TURN_BUSY_REFUSALS.labels("lease").inc()
            elif error.reason == "TURN_QUEUE_FULL":
                metrics.TURN_QUEUE_FULL.inc()
            await self._leave(group, namespace, cid, turn_id, ticket)
            raise
        except BaseException:
            await self._leave(group, namespace, cid, turn_id, ticket)
            raise
        finally:
            if waiting is not None:
                metrics.TURNS_WAITING.labels(waiting).dec()
            if counted:
                self._count_out(namespace, group)
            self._part(key, group)

    async def _retry(self, group: _Waiters, request: LeaseRequest) -> LeaseAttempt:
        """Try again after a wait: one try at a time per conversation, a few at a time
        in the process."""
        if self._retrying is None:
            self._retrying = asyncio.Semaphore(_RETRYING)
        async with group.trying, self._retrying:
            return await self.store.acquire_turn(request)

    async def _leave(
        self, group: _Waiters, namespace: str, cid: uuid.UUID, turn_id: str, ticket: int | None
    ) -> None:
        """The caller left the queue (deadline, cancellation, failure): give up the place."""
        if ticket is not None:
            with contextlib.suppress(Exception):
                await finish_regardless(
                    self.store.leave_queue(namespace, cid, turn_id, ticket), "leaving a turn queue"
                )
            self._wake(group)

    async def renew_turn_lease(
        self,
        namespace: str,
        conversation_id_text: str,
        turn_id_text: str,
        fencing_token: int,
        ttl_s: float,
        calling_model: bool = False,
    ) -> TurnLease:
        """Extend a lease the caller holds; ABORTED / TURN_LEASE_LOST when it lapsed. With
        `calling_model` the holder says it begins its model call: if its lease lapses
        from now on before it commits, no repeat of its turn id takes the lease over (the
        turn ends as TURN_INTERRUPTED), so that the model never runs twice for one id."""
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        turn_id = validation.request_id(turn_id_text, "turn_id") or ""
        lease = await self.store.renew_turn(
            namespace, cid, turn_id, fencing_token, _lease_ttl(ttl_s), calling_model
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
        model_call_failed: bool = False,
    ) -> bool:
        """End a lease without an append; with `ended`, keep the turn's outcome so that a
        repeat of its id returns it. Without: a turn that had begun its model call ends
        as TURN_INTERRUPTED, unless `model_call_failed` (nothing came of that call). False
        when the lease was no longer held."""
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
            model_call_failed,
        )
        self._wake_local((namespace, cid))
        return released

    def appended(self, namespace: str, conversation_id_text: str) -> None:
        """An append committed here (it may have ended a lease): wake local waiters."""
        with contextlib.suppress(DomainError):
            self._wake_local((namespace, conversation_id(conversation_id_text)))

    def _wake_local(self, key: Key) -> None:
        group = self._groups.get(key)
        if group is not None:
            self._wake(group)


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
