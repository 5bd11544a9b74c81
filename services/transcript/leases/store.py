"""Turn leases in the store: the protocol (`TurnLeaseStore`) and its PostgreSQL adapter
(mixed into PostgresTranscriptStore, services/transcript/store.py), its SQL in
statements.py.

An exclusive lease is copied onto the conversation row (lease_turn_id,
lease_fencing_token, lease_until: migrations/0002, 0006), so that an append
waiting for that row is re-checked against a lease granted meanwhile.
Every lease decision runs `model.decide_lease` with the conversation locked:
FOR UPDATE for exclusive and queued leases, FOR KEY SHARE (which appends do not
wait for) and an advisory lock on the turn id for shared ones; a shared lease
for a turn id never seen here is granted in one statement, arbitrated by the
unique (conversation, turn id) index.
"""

from __future__ import annotations

import uuid
from typing import Any, Protocol

from psycopg.types.json import Jsonb

from services.common.postgres.pool import AsyncConn, fetch_one
from services.transcript import metrics
from services.transcript.conversations.model import (
    AppendRecord,
    conversation_erased,
    conversation_not_found,
)
from services.transcript.conversations.statements import KEY
from services.transcript.conversations.store import PostgresBase, record_from_row
from services.transcript.leases import statements as sql
from services.transcript.leases.model import (
    EndedTurn,
    Enqueue,
    Granted,
    LeaseAttempt,
    LeaseMode,
    LeaseRequest,
    TurnLease,
    TurnRow,
    Waiting,
    decide_lease,
    ended_from_json,
    ended_to_json,
    interrupted,
)

# The stored outcome of an interrupted turn (the same for every one).
_INTERRUPTED = Jsonb(ended_to_json(interrupted()))
# A waiting turn's place in the queue lapses this long after its caller last
# looked (the caller looks every RUNIFOLD_TURN_WAIT_POLL_S, at most 5 s): a
# waiter whose process died stops holding up the turns behind it.
WAIT_LEASE_S = 10.0
# A conversation with waiters stays marked as watched this long after a waiter last
# looked (renewed when less than _MARK_RENEW_BEFORE_S is left).
_WAITED_MARK_S = 30.0
_MARK_RENEW_BEFORE_S = 20.0
# Expired leases and waiting places are swept this long after they lapsed (the
# lease rule ignores them at once; the rows only tell a late holder it lost).
_EXPIRED_GRACE_S = 60.0


class TurnLeaseStore(Protocol):
    """The turn-lease part of TranscriptStore (every method atomic)."""

    async def acquire_turn(self, request: LeaseRequest) -> LeaseAttempt:
        """Apply `decide_lease` with the conversation locked and carry out its decision."""

    async def renew_turn(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        turn_id: str,
        fencing_token: int,
        ttl_s: float,
        calling_model: bool = False,
    ) -> TurnLease | None:
        """Extend a live lease (and, `calling_model`, record that its holder begins its
        model call); None when it expired or was taken over."""

    async def release_turn(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        turn_id: str,
        fencing_token: int,
        ended: EndedTurn | None,
        retention_s: float,
        model_call_failed: bool = False,
    ) -> bool:
        """End a lease without an append (recording `ended` when given, or, when its
        holder had begun its model call and does not say that call failed, the
        interrupted outcome); False when it was no longer held. A conversation the turn
        created and never wrote goes too."""

    async def leave_queue(
        self, namespace: str, conversation_id: uuid.UUID, turn_id: str, ticket: int
    ) -> None:
        """Give up a place in the queue (the waiting caller left)."""

    async def sweep_turns(self, limit: int, retention_s: float = 24 * 3600.0) -> int:
        """Delete up to `limit` lapsed rows: ended turns past retention, expired leases
        and waiting places, and empty conversations whose creating turn vanished; keep a
        lapsed lease whose holder had begun its model call as interrupted (for
        `retention_s`)."""


# --- PostgreSQL -------------------------------------------------------------


class PostgresTurnLeases(PostgresBase):
    """TurnLeaseStore on PostgreSQL (schema `transcript`)."""

    async def acquire_turn(self, request: LeaseRequest) -> LeaseAttempt:
        params: dict[str, Any] = {
            "namespace": request.namespace,
            "conversation_id": request.conversation_id,
            "turn_id": request.turn_id,
            "ticket": request.ticket,
            "ttl_s": request.ttl_s,
            "wait_s": WAIT_LEASE_S,
            "payload_hash": request.payload_hash,
            "mark_s": _WAITED_MARK_S,
            "renew_before_s": _MARK_RENEW_BEFORE_S,
        }
        # Exclusive and queued leases lock the conversation row against every other
        # lease decision; shared ones only against those (FOR KEY SHARE does not wait
        # for appends), and against their own turn id's (an advisory lock).
        lock = sql.LOCK_CONVERSATION if request.mode != LeaseMode.SHARED else sql.SHARE_CONVERSATION
        async with self.db.connection() as conn:
            if (
                request.mode == LeaseMode.SHARED
                and request.ticket is None
                and request.conversation_key is None
            ):
                # The common case in one statement: a turn id never seen here. The
                # unique (conversation, turn id) index arbitrates racing duplicates;
                # anything else (a known turn id, a missing conversation) takes the
                # transaction below.
                fast = await fetch_one(conn, sql.GRANT_NEW_SHARED, params)
                if fast is not None:
                    self.changed(fast[2], fast[3])
                    return TurnLease(
                        request.conversation_id, request.turn_id, fast[0], fast[1], False
                    )
            attempt = await self._acquire_turn(conn, request, params, lock)
        if isinstance(attempt, TurnLease):
            self.changed(params["key"], params["watched"])
        return attempt

    async def _acquire_turn(
        self, conn: AsyncConn, request: LeaseRequest, params: dict[str, Any], lock: str
    ) -> LeaseAttempt:
        async with conn.transaction():
            row = await fetch_one(conn, lock, params)
            created = False
            if row is None and request.create_if_missing:
                row = await fetch_one(conn, sql.INSERT_PROVISIONAL, params)
                created = row is not None
                if row is None:  # created by someone else meanwhile
                    row = await fetch_one(conn, lock, params)
            if row is None:
                raise conversation_not_found()
            if request.conversation_key is not None and row[0] != request.conversation_key:
                raise conversation_erased()  # what the caller waited on is gone
            params["key"], params["watched"] = row
            await conn.execute(sql.LOCK_TURN_ID, params)
            # Leases (and places) of other turns that lapsed: their holders are gone. The
            # row goes, so a late append quoting its token finds nothing and is refused;
            # one whose holder had begun its model call is kept, as interrupted.
            params["interrupted"] = _INTERRUPTED
            params["retention_s"] = request.outcome_retention_s
            cursor = await conn.execute(sql.INTERRUPT_LAPSED, params)
            metrics.TURNS_INTERRUPTED.inc(cursor.rowcount)
            metrics.TURN_LEASE_EXPIRIES.inc(cursor.rowcount)
            cursor = await conn.execute(sql.DROP_LAPSED, params)
            metrics.TURN_LEASE_EXPIRIES.inc(
                sum(1 for (state,) in await cursor.fetchall() if state == "running")
            )
            cursor = await conn.execute(sql.TURN_ROWS, params)
            own: TurnRow | None = None
            others: list[TurnRow] = []
            for (
                turn_id,
                state,
                exclusive,
                ticket,
                fencing_token,
                digest,
                live,
                outcome,
                end_time,
                model_called,
            ) in await cursor.fetchall():
                found = TurnRow(
                    turn_id,
                    state,
                    exclusive,
                    ticket,
                    fencing_token,
                    bytes(digest),
                    live,
                    ended_from_json(outcome, end_time) if state == "ended" else None,
                    model_called,
                )
                if turn_id == request.turn_id:
                    own = found
                else:
                    others.append(found)
            prior_row = await fetch_one(conn, sql.PRIOR_APPEND, params)
            prior = record_from_row(prior_row) if prior_row else None
            decision = decide_lease(request, own, others, prior)
            if isinstance(decision, EndedTurn) and own is not None and own.state == "running":
                # Interrupted (its holder lost its lease during its model call): kept as
                # the turn's outcome, so every later repeat gets it at once.
                params["seen_fencing_token"] = own.fencing_token
                params["outcome"] = _INTERRUPTED
                await conn.execute(sql.INTERRUPT, params)
                metrics.TURNS_INTERRUPTED.inc()
                metrics.TURN_LEASE_EXPIRIES.inc()
            if isinstance(decision, AppendRecord | EndedTurn):
                return decision
            # The row this decision saw, by its ticket or its fencing token (see SEEN_ROW).
            params["seen_ticket"] = own.ticket if own is not None else None
            params["seen_fencing_token"] = own.fencing_token if own is not None else None
            key = params["key"]
            if isinstance(decision, Enqueue):
                await conn.execute(sql.MARK_WAITED, params)
                ticket_row = await fetch_one(conn, sql.ENQUEUE, params)
                if ticket_row is None:  # a racing grant of this turn id: wait for it
                    return Waiting(same_turn=True, ticket=None, key=key)
                return Waiting(same_turn=False, ticket=ticket_row[0], key=key)
            if not isinstance(decision, Granted):
                await conn.execute(sql.MARK_WAITED, params)
                if not decision.same_turn:  # still in line: keep the place
                    await conn.execute(sql.KEEP_PLACE, params)
                ticket = None if decision.same_turn else request.ticket
                return Waiting(decision.same_turn, ticket, key)
            if decision.takeover:
                metrics.TURN_LEASE_EXPIRIES.inc()
            params["exclusive"] = decision.exclusive
            granted = await fetch_one(conn, sql.GRANT, params)
            if granted is None:  # a racing grant of this turn id: wait for it
                return Waiting(same_turn=True, ticket=None, key=key)
            fencing_token, expire_time = granted
        return TurnLease(
            request.conversation_id,
            request.turn_id,
            fencing_token,
            expire_time,
            decision.exclusive,
            created,
        )

    async def renew_turn(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        turn_id: str,
        fencing_token: int,
        ttl_s: float,
        calling_model: bool = False,
    ) -> TurnLease | None:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                sql.RENEW,
                {
                    "namespace": namespace,
                    "conversation_id": conversation_id,
                    "turn_id": turn_id,
                    "fencing_token": fencing_token,
                    "ttl_s": ttl_s,
                    "calling_model": calling_model,
                },
            )
        if row is None:
            return None
        exclusive, expire_time = row
        return TurnLease(conversation_id, turn_id, fencing_token, expire_time, exclusive)

    async def release_turn(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        turn_id: str,
        fencing_token: int,
        ended: EndedTurn | None,
        retention_s: float,
        model_call_failed: bool = False,
    ) -> bool:
        params: dict[str, Any] = {
            "namespace": namespace,
            "conversation_id": conversation_id,
            "turn_id": turn_id,
            "fencing_token": fencing_token,
            "outcome": Jsonb(ended_to_json(ended)) if ended is not None else None,
            "interrupted": _INTERRUPTED,
            "retention_s": retention_s,
            "model_call_failed": model_call_failed,
        }
        async with self.db.connection() as conn, conn.transaction():
            row = await fetch_one(conn, sql.LOCK_CONVERSATION, params)
            if row is None:
                return False
            key, watched = row
            params["key"] = key
            held = await fetch_one(conn, sql.END_TURN, params)
            if held is None:
                return False
            await conn.execute(sql.DROP_EXCLUSIVE, params)
            (dropped,) = held
            if dropped:
                # A conversation this turn created and nobody wrote goes with it.
                await conn.execute(sql.DROP_PROVISIONAL, params)
        self.changed(key, watched)
        return True

    async def leave_queue(
        self, namespace: str, conversation_id: uuid.UUID, turn_id: str, ticket: int
    ) -> None:
        async with self.db.connection() as conn:
            await conn.execute(
                f"""DELETE FROM transcript.turns
                     WHERE conversation_key = {KEY} AND turn_id = %(turn_id)s
                       AND ticket = %(ticket)s AND state = 'waiting'""",
                {
                    "namespace": namespace,
                    "conversation_id": conversation_id,
                    "turn_id": turn_id,
                    "ticket": ticket,
                },
            )

    async def sweep_turns(self, limit: int, retention_s: float = 24 * 3600.0) -> int:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.SWEEP_INTERRUPTED,
                {
                    "limit": limit,
                    "grace_s": _EXPIRED_GRACE_S,
                    "interrupted": _INTERRUPTED,
                    "retention_s": retention_s,
                },
            )
            metrics.TURNS_INTERRUPTED.inc(cursor.rowcount)
            metrics.TURN_LEASE_EXPIRIES.inc(cursor.rowcount)
            cursor = await conn.execute(
                sql.SWEEP_TURNS, {"limit": limit, "grace_s": _EXPIRED_GRACE_S}
            )
            turns = cursor.rowcount
            cursor = await conn.execute(
                sql.SWEEP_PROVISIONAL, {"limit": limit, "grace_s": _EXPIRED_GRACE_S}
            )
            return turns + cursor.rowcount
