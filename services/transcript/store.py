"""Transcript persistence: the store protocol and its PostgreSQL adapter.

An append is ONE SQL statement run in autocommit: the compare-and-swap bump
of the conversation row, the append record (whose unique index on request
id makes idempotency exact) and the entries. If any part fails, e.g. the
request id was already recorded, PostgreSQL aborts the whole statement and
nothing is written. Only when the statement wrote nothing do we look at why
(missing conversation, version conflict, replay).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import psycopg
from psycopg.types.json import Jsonb

from services.common import metrics
from services.common.db import AsyncConn, Database, fetch_one
from services.common.domain import SEQUENCE_MAX, Entry, Message, Role, ToolCall, Usage
from services.common.errors import VersionConflict
from services.transcript.model import (
    AppendRecord,
    AppendResult,
    Conversation,
    EndedTurn,
    Enqueue,
    Granted,
    LeaseAttempt,
    LeaseMode,
    LeaseRequest,
    NewAppend,
    TurnLease,
    TurnRow,
    ViewRead,
    Waiting,
    conversation_busy,
    conversation_not_found,
    decide_lease,
    ended_from_json,
    ended_to_json,
    request_id_reused,
    turn_lease_lost,
)

# A waiting turn's place in the queue lapses this long after its caller last
# looked (the caller looks every RUNIFOLD_TURN_WAIT_POLL_S, at most 2 s): a
# waiter whose process died stops holding up the turns behind it.
WAIT_LEASE_S = 10.0
# Expired leases and waiting places are swept this long after they lapsed (the
# lease rule ignores them at once; the rows only tell a late holder it lost).
_EXPIRED_GRACE_S = 60.0


class TranscriptStore(Protocol):
    """What the transcript service needs from a store. Every method is atomic."""

    async def create_conversation(
        self, namespace: str, conversation_id: uuid.UUID, labels: Mapping[str, str]
    ) -> tuple[Conversation, bool]:
        """Insert unless it exists; return it and whether it was created."""

    async def get_conversation(
        self, namespace: str, conversation_id: uuid.UUID
    ) -> Conversation | None:
        """The conversation, or None (also for another namespace's)."""

    async def append(self, append: NewAppend) -> AppendResult:
        """Commit entries at the expected version, or replay the recorded request.

        Raises VersionConflict, CONVERSATION_NOT_FOUND or REQUEST_ID_REUSED and
        then writes nothing.
        """

    async def read_entries(
        self, namespace: str, conversation_id: uuid.UUID, ranges: Sequence[tuple[int, int]]
    ) -> list[Entry]:
        """Entries whose sequence lies in the inclusive, disjoint ranges (at most two), in order."""

    async def read_view(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        window: int,
        summary_batch: int,
        summarized_through: int,
        request_id: str | None,
    ) -> ViewRead | None:
        """In one consistent read: the counters, the prior append of `request_id`, and the
        entries in [low, last] and [summarized_through + 1, min(summarized_through +
        summary_batch + 1, low - 1)] where low = max(1, last - window + 1).
        None when the conversation does not exist."""

    async def list_entries(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        after_sequence: int,
        through_sequence: int | None,
        limit: int,
    ) -> list[Entry] | None:
        """Up to `limit` entries after a sequence; None when the conversation is missing."""

    async def list_conversations(
        self, namespace: str, after: uuid.UUID | None, limit: int
    ) -> list[Conversation]:
        """Conversations of a namespace in id order, after a cursor."""

    async def delete_conversation(
        self, namespace: str, conversation_id: uuid.UUID, incarnation: int = 0
    ) -> int | None:
        """Erase it (only that incarnation, when given); return the number of entries
        erased, or None if it did not exist."""

    async def acquire_turn(self, request: LeaseRequest) -> LeaseAttempt:
        """Apply `decide_lease` with the conversation locked and carry out its decision."""

    async def renew_turn(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        turn_id: str,
        fencing_token: int,
        ttl_s: float,
    ) -> TurnLease | None:
        """Extend a live lease; None when it expired or was taken over."""

    async def release_turn(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        turn_id: str,
        fencing_token: int,
        ended: EndedTurn | None,
        retention_s: float,
    ) -> bool:
        """End a lease without an append (recording `ended` when given); False when it
        was no longer held. A conversation the turn created and never wrote goes too."""

    async def leave_queue(
        self, namespace: str, conversation_id: uuid.UUID, turn_id: str, ticket: int
    ) -> None:
        """Give up a place in the queue (the waiting caller left)."""

    async def sweep_turns(self, limit: int) -> int:
        """Delete up to `limit` lapsed rows: ended turns past retention, expired leases
        and waiting places, and empty conversations whose creating turn vanished."""


# --- PostgreSQL -------------------------------------------------------------

_APPEND = """
WITH lease AS (
    -- The turn lease the append commits under, locked: an UPDATE of the row by a
    -- takeover that committed meanwhile is seen here, not an older snapshot.
    SELECT t.turn_id FROM transcript.turns AS t
     WHERE t.conversation_key = (SELECT conversation_key FROM transcript.conversations
                                  WHERE namespace = %(namespace)s
                                    AND conversation_id = %(conversation_id)s)
       AND t.turn_id = %(request_id)s AND t.ticket = %(fencing_token)s::bigint
       AND t.state = 'running' AND t.lease_until >= now()
       FOR UPDATE
), bumped AS (
    UPDATE transcript.conversations
       SET version = version + 1,
           last_sequence = last_sequence + %(count)s,
           update_time = now(),
           provisional_turn_id = NULL,
           lease_turn_id = CASE WHEN lease_token = %(fencing_token)s::bigint
                                THEN NULL ELSE lease_turn_id END,
           lease_until = CASE WHEN lease_token = %(fencing_token)s::bigint
                              THEN NULL ELSE lease_until END,
           lease_token = CASE WHEN lease_token = %(fencing_token)s::bigint
                              THEN NULL ELSE lease_token END
     WHERE namespace = %(namespace)s
       AND conversation_id = %(conversation_id)s
       AND (%(expected_version)s::bigint IS NULL OR version = %(expected_version)s::bigint)
       -- No other turn holds the conversation exclusively (re-checked on the newest
       -- row version when a lease was granted while this statement waited).
       AND (lease_until IS NULL OR lease_until < now() OR lease_token = %(fencing_token)s::bigint)
       AND (%(fencing_token)s::bigint IS NULL OR EXISTS (SELECT 1 FROM lease))
 RETURNING conversation_key, version, last_sequence, update_time
), finished AS (
    -- The commit ends the turn's lease. The row stays a while (the sweep removes it):
    -- it keeps a one-statement grant whose snapshot predates this commit (and so does
    -- not see the append below) from granting the committed turn id again.
    UPDATE transcript.turns AS t
       SET state = 'committed', lease_until = now() + interval '1 minute'
      FROM bumped AS b
     WHERE t.conversation_key = b.conversation_key AND t.turn_id = %(request_id)s
       AND %(fencing_token)s::bigint IS NOT NULL
), recorded AS (
    INSERT INTO transcript.appends
           (conversation_key, version, first_sequence, last_sequence, request_id,
            payload_hash, input_tokens, output_tokens, model_calls, commit_time)
    SELECT conversation_key, version, last_sequence - %(count)s + 1, last_sequence,
           %(request_id)s, %(payload_hash)s, %(input_tokens)s, %(output_tokens)s,
           %(model_calls)s, update_time
      FROM bumped
), written AS (
    INSERT INTO transcript.entries
           (conversation_key, sequence, role, text, tool_calls, tool_call_id, metadata,
            created_at)
    SELECT b.conversation_key, b.last_sequence - %(count)s + m.ord, m.role, m.text,
           NULLIF(m.tool_calls, '[]'), NULLIF(m.tool_call_id, ''), NULLIF(m.metadata, '{}'),
           b.update_time
      FROM bumped AS b,
           ROWS FROM (jsonb_to_recordset(%(messages)s::jsonb)
                      AS (role smallint, text text, tool_calls jsonb, tool_call_id text,
                          metadata jsonb))
               WITH ORDINALITY AS m(role, text, tool_calls, tool_call_id, metadata, ord)
)
SELECT version, last_sequence, update_time FROM bumped
"""

# Why an append wrote nothing: the version, a prior append of the request id, the
# exclusive lease holder, and whether the quoted lease is still held.
_WHY_NOT_APPENDED = """
SELECT c.version, a.version, a.first_sequence, a.last_sequence, a.input_tokens,
       a.output_tokens, a.model_calls, a.commit_time, a.payload_hash,
       c.lease_turn_id, coalesce(c.lease_until >= now(), false), c.lease_token,
       EXISTS (SELECT 1 FROM transcript.turns AS t
                WHERE t.conversation_key = c.conversation_key
                  AND t.turn_id = %(request_id)s AND t.ticket = %(fencing_token)s::bigint
                  AND t.state = 'running' AND t.lease_until >= now())
  FROM transcript.conversations AS c
  LEFT JOIN LATERAL (
        SELECT * FROM transcript.appends AS a
         WHERE a.conversation_key = c.conversation_key AND a.request_id = %(request_id)s
  ) AS a ON true
 WHERE c.namespace = %(namespace)s AND c.conversation_id = %(conversation_id)s
"""

# The conversation key as a scalar subquery: keeps every entry and append
# lookup an index scan on the child table's primary key.
_KEY = """(SELECT conversation_key FROM transcript.conversations
           WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s)"""

_CONVERSATION_COLUMNS = (
    "conversation_id, namespace, version, last_sequence, create_time, update_time, labels, "
    "incarnation"
)
_ENTRY_COLUMNS = (
    "e.sequence, e.role, e.text, e.tool_calls, e.tool_call_id, e.metadata, e.created_at"
)


def _conversation(row: Sequence[Any]) -> Conversation:
    return Conversation(row[0], row[1], row[2], row[3], row[4], row[5], row[6] or {}, row[7])


def _entry(row: Sequence[Any]) -> Entry:
    sequence, role, text, tool_calls, tool_call_id, metadata, created_at = row
    return Entry(
        sequence=sequence,
        message=Message(
            role=Role(role),
            text=text,
            tool_calls=tuple(ToolCall(*call) for call in tool_calls or ()),
            tool_call_id=tool_call_id or "",
            metadata=metadata or {},
        ),
        created_at=created_at,
    )


def _record(row: Sequence[Any]) -> AppendRecord:
    version, first, last, input_tokens, output_tokens, model_calls, commit_time, digest = row
    return AppendRecord(
        version,
        first,
        last,
        Usage(input_tokens, output_tokens, model_calls),
        commit_time,
        bytes(digest) if digest is not None else None,
    )


def append_parameters(append: NewAppend) -> dict[str, Any]:
    """The parameters of the append statement.

    The messages travel as ONE jsonb parameter, their canonical JSON, which the
    domain already computed to hash them: adapting one string is far cheaper
    than five arrays.
    """
    messages = append.messages
    return {
        "namespace": append.namespace,
        "conversation_id": append.conversation_id,
        "expected_version": append.expected_version,
        "count": len(messages),
        "request_id": append.request_id,
        "payload_hash": append.payload_hash,
        "input_tokens": append.usage.input_tokens,
        "output_tokens": append.usage.output_tokens,
        "model_calls": append.usage.model_calls,
        "messages": append.encoded,
        "fencing_token": append.fencing_token,
    }


class PostgresTranscriptStore:
    """TranscriptStore on PostgreSQL (schema `transcript`)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def create_conversation(
        self, namespace: str, conversation_id: uuid.UUID, labels: Mapping[str, str]
    ) -> tuple[Conversation, bool]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                f"""INSERT INTO transcript.conversations (namespace, conversation_id, labels)
                    VALUES (%s, %s, %s)
                    ON CONFLICT (namespace, conversation_id) DO NOTHING
                    RETURNING {_CONVERSATION_COLUMNS}""",
                (namespace, conversation_id, Jsonb(dict(labels))),
            )
            row = await cursor.fetchone()
            if row is not None:
                return _conversation(row), True
            existing = await self._get(conn, namespace, conversation_id)
        if existing is None:  # deleted between the two statements
            raise conversation_not_found()
        return existing, False

    async def _get(
        self, conn: Any, namespace: str, conversation_id: uuid.UUID
    ) -> Conversation | None:
        cursor = await conn.execute(
            f"""SELECT {_CONVERSATION_COLUMNS} FROM transcript.conversations
                 WHERE namespace = %s AND conversation_id = %s""",
            (namespace, conversation_id),
        )
        row = await cursor.fetchone()
        return _conversation(row) if row else None

    async def get_conversation(
        self, namespace: str, conversation_id: uuid.UUID
    ) -> Conversation | None:
        async with self.db.connection() as conn:
            return await self._get(conn, namespace, conversation_id)

    async def append(self, append: NewAppend) -> AppendResult:
        params = append_parameters(append)
        async with self.db.connection() as conn:
            try:
                cursor = await conn.execute(_APPEND, params)
                row = await cursor.fetchone()
            except psycopg.errors.UniqueViolation:
                row = None  # the request id is recorded: nothing was written; replay below
            if row is not None:
                version, last, commit_time = row
                return AppendResult(
                    AppendRecord(
                        version,
                        last - len(append.messages) + 1,
                        last,
                        append.usage,
                        commit_time,
                        append.payload_hash,
                    ),
                    replayed=False,
                )
            cursor = await conn.execute(_WHY_NOT_APPENDED, params)
            why = await cursor.fetchone()
        if why is None:
            raise conversation_not_found()
        if why[1] is not None:
            record = _record(why[1:9])
            if record.payload_hash != append.payload_hash:
                raise request_id_reused()
            return AppendResult(record, replayed=True)
        holder, lease_live, lease_token, own_live = why[9:13]
        if append.fencing_token is not None and not own_live:
            metrics.TURN_FENCE_REFUSALS.inc()
            raise turn_lease_lost()
        if lease_live and lease_token != append.fencing_token:
            metrics.TURN_BUSY_REFUSALS.labels("append").inc()
            raise conversation_busy(holder)
        metrics.APPEND_CONFLICTS.inc()
        if append.expected_version is None:
            # Only a racing duplicate of a request id can get here; it has committed by now.
            raise VersionConflict(why[0], why[0])
        raise VersionConflict(why[0], append.expected_version)

    async def read_entries(
        self, namespace: str, conversation_id: uuid.UUID, ranges: Sequence[tuple[int, int]]
    ) -> list[Entry]:
        if not ranges:
            return []
        if len(ranges) > 2:
            raise ValueError("at most two ranges")
        (low1, high1), (low2, high2) = ranges[0], ranges[1] if len(ranges) == 2 else (1, 0)
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                VIEW_ENTRIES_SQL,
                {
                    "namespace": namespace,
                    "conversation_id": conversation_id,
                    "low1": low1,
                    "high1": high1,
                    "low2": low2,
                    "high2": high2,
                },
            )
            return [_entry(row) for row in await cursor.fetchall()]

    async def read_view(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        window: int,
        summary_batch: int,
        summarized_through: int,
        request_id: str | None,
    ) -> ViewRead | None:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                VIEW_SQL,
                {
                    "namespace": namespace,
                    "conversation_id": conversation_id,
                    "window": window,
                    "batch": summary_batch,
                    "through": summarized_through,
                    "request_id": request_id,
                },
            )
            rows = await cursor.fetchall()
        if not rows:
            return None
        first = rows[0]
        prior = _record(first[3:11]) if first[3] is not None else None
        entries = [_entry(row[11:]) for row in rows if row[11] is not None]
        return ViewRead(first[0], first[1], entries, prior, first[2])

    async def list_entries(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        after_sequence: int,
        through_sequence: int | None,
        limit: int,
    ) -> list[Entry] | None:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                f"""SELECT {_ENTRY_COLUMNS}
                      FROM transcript.entries AS e
                     WHERE e.conversation_key = {_KEY}
                       AND e.sequence > %(after)s AND e.sequence <= %(through)s
                     ORDER BY e.sequence
                     LIMIT %(limit)s""",
                {
                    "namespace": namespace,
                    "conversation_id": conversation_id,
                    "after": after_sequence,
                    "limit": limit,
                    "through": SEQUENCE_MAX if through_sequence is None else through_sequence,
                },
            )
            rows = await cursor.fetchall()
            if not rows and await self._get(conn, namespace, conversation_id) is None:
                return None
        return [_entry(row) for row in rows]

    async def list_conversations(
        self, namespace: str, after: uuid.UUID | None, limit: int
    ) -> list[Conversation]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                f"""SELECT {_CONVERSATION_COLUMNS} FROM transcript.conversations
                     WHERE namespace = %s AND (%s::uuid IS NULL OR conversation_id > %s::uuid)
                     ORDER BY conversation_id
                     LIMIT %s""",
                (namespace, after, after, limit),
            )
            return [_conversation(row) for row in await cursor.fetchall()]

    async def delete_conversation(
        self, namespace: str, conversation_id: uuid.UUID, incarnation: int = 0
    ) -> int | None:
        async with self.db.connection() as conn, conn.transaction():
            cursor = await conn.execute(
                """DELETE FROM transcript.conversations
                    WHERE namespace = %s AND conversation_id = %s
                      AND (%s::bigint = 0 OR incarnation = %s::bigint)
                RETURNING conversation_key""",
                (namespace, conversation_id, incarnation, incarnation),
            )
            row = await cursor.fetchone()
            if row is None:
                return None
            (key,) = row
            await conn.execute("DELETE FROM transcript.appends WHERE conversation_key = %s", (key,))
            await conn.execute("DELETE FROM transcript.turns WHERE conversation_key = %s", (key,))
            cursor = await conn.execute(
                "DELETE FROM transcript.entries WHERE conversation_key = %s", (key,)
            )
            deleted: int = cursor.rowcount
        return deleted

    # -- turn leases ------------------------------------------------------------

    async def acquire_turn(self, request: LeaseRequest) -> LeaseAttempt:
        params: dict[str, Any] = {
            "namespace": request.namespace,
            "conversation_id": request.conversation_id,
            "turn_id": request.turn_id,
            "ticket": request.ticket,
            "ttl_s": request.ttl_s,
            "wait_s": WAIT_LEASE_S,
            "payload_hash": request.payload_hash,
        }
        # Exclusive and queued leases lock the conversation row against every other
        # lease decision; shared ones only against those (FOR KEY SHARE does not wait
        # for appends), and against their own turn id's (an advisory lock).
        lock = _LOCK_CONVERSATION if request.mode != LeaseMode.SHARED else _SHARE_CONVERSATION
        async with self.db.connection() as conn:
            if request.mode == LeaseMode.SHARED and request.ticket is None:
                # The common case in one statement: a turn id never seen here. The
                # unique (conversation, turn id) index arbitrates racing duplicates;
                # anything else (a known turn id, a missing conversation) takes the
                # transaction below.
                fast = await fetch_one(conn, _GRANT_NEW_SHARED, params)
                if fast is not None:
                    return TurnLease(
                        request.conversation_id, request.turn_id, fast[0], fast[1], False
                    )
            return await self._acquire_turn(conn, request, params, lock)

    async def _acquire_turn(
        self, conn: AsyncConn, request: LeaseRequest, params: dict[str, Any], lock: str
    ) -> LeaseAttempt:
        async with conn.transaction():
            row = await fetch_one(conn, lock, params)
            created = False
            if row is None and request.create_if_missing:
                row = await fetch_one(conn, _INSERT_PROVISIONAL, params)
                created = row is not None
                if row is None:  # created by someone else meanwhile
                    row = await fetch_one(conn, lock, params)
            if row is None:
                raise conversation_not_found()
            params["key"] = row[0]
            await conn.execute(_LOCK_TURN_ID, params)
            # Leases (and places) of other turns that lapsed: their holders are gone. The
            # row goes, so a late append quoting its token finds nothing and is refused.
            cursor = await conn.execute(_DROP_LAPSED, params)
            metrics.TURN_LEASE_EXPIRIES.inc(
                sum(1 for (state,) in await cursor.fetchall() if state == "running")
            )
            cursor = await conn.execute(_TURN_ROWS, params)
            own: TurnRow | None = None
            others: list[TurnRow] = []
            for (
                turn_id,
                state,
                exclusive,
                ticket,
                digest,
                live,
                outcome,
                end_time,
            ) in await cursor.fetchall():
                found = TurnRow(
                    turn_id,
                    state,
                    exclusive,
                    ticket,
                    bytes(digest),
                    live,
                    ended_from_json(outcome, end_time) if state == "ended" else None,
                )
                if turn_id == request.turn_id:
                    own = found
                else:
                    others.append(found)
            prior_row = await fetch_one(conn, _PRIOR_APPEND, params)
            prior = _record(prior_row) if prior_row else None
            decision = decide_lease(request, own, others, prior)
            if isinstance(decision, AppendRecord | EndedTurn):
                return decision
            params["seen_ticket"] = own.ticket if own is not None else None
            if isinstance(decision, Enqueue):
                ticket_row = await fetch_one(conn, _ENQUEUE, params)
                if ticket_row is None:  # a racing grant of this turn id: wait for it
                    return Waiting(same_turn=True, ticket=None)
                return Waiting(same_turn=False, ticket=ticket_row[0])
            if not isinstance(decision, Granted):
                if not decision.same_turn:  # still in line: keep the place
                    await conn.execute(_KEEP_PLACE, params)
                return Waiting(decision.same_turn, None if decision.same_turn else request.ticket)
            if decision.takeover:
                metrics.TURN_LEASE_EXPIRIES.inc()
            params["exclusive"] = decision.exclusive
            granted = await fetch_one(conn, _GRANT, params)
            if granted is None:  # a racing grant of this turn id: wait for it
                return Waiting(same_turn=True, ticket=None)
            token, expire_time = granted
        return TurnLease(
            request.conversation_id,
            request.turn_id,
            token,
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
    ) -> TurnLease | None:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                _RENEW,
                {
                    "namespace": namespace,
                    "conversation_id": conversation_id,
                    "turn_id": turn_id,
                    "fencing_token": fencing_token,
                    "ttl_s": ttl_s,
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
    ) -> bool:
        params: dict[str, Any] = {
            "namespace": namespace,
            "conversation_id": conversation_id,
            "turn_id": turn_id,
            "fencing_token": fencing_token,
            "outcome": Jsonb(ended_to_json(ended)) if ended is not None else None,
            "retention_s": retention_s,
        }
        async with self.db.connection() as conn, conn.transaction():
            row = await fetch_one(conn, _LOCK_CONVERSATION, params)
            if row is None:
                return False
            params["key"] = row[0]
            held = await fetch_one(conn, _END_TURN, params)
            if held is None:
                return False
            await conn.execute(_DROP_EXCLUSIVE, params)
            if ended is None:
                # A conversation this turn created and nobody wrote goes with it.
                await conn.execute(_DROP_PROVISIONAL, params)
        return True

    async def leave_queue(
        self, namespace: str, conversation_id: uuid.UUID, turn_id: str, ticket: int
    ) -> None:
        async with self.db.connection() as conn:
            await conn.execute(
                f"""DELETE FROM transcript.turns
                     WHERE conversation_key = {_KEY} AND turn_id = %(turn_id)s
                       AND ticket = %(ticket)s AND state = 'waiting'""",
                {
                    "namespace": namespace,
                    "conversation_id": conversation_id,
                    "turn_id": turn_id,
                    "ticket": ticket,
                },
            )

    async def sweep_turns(self, limit: int) -> int:
        async with self.db.connection() as conn:
            cursor = await conn.execute(_SWEEP_TURNS, {"limit": limit, "grace_s": _EXPIRED_GRACE_S})
            turns = cursor.rowcount
            cursor = await conn.execute(
                _SWEEP_PROVISIONAL, {"limit": limit, "grace_s": _EXPIRED_GRACE_S}
            )
            return turns + cursor.rowcount


# -- the statements of turn leases -------------------------------------------------

_LOCK_CONVERSATION = """
SELECT conversation_key FROM transcript.conversations
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
   FOR UPDATE
"""

# A shared lease for a turn id that has no row and no append yet, in one statement.
_GRANT_NEW_SHARED = """
WITH c AS (
    SELECT conversation_key FROM transcript.conversations
     WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
       FOR KEY SHARE
)
INSERT INTO transcript.turns
       (conversation_key, turn_id, state, exclusive, ticket, payload_hash, lease_until)
SELECT c.conversation_key, %(turn_id)s, 'running', false, transcript.random_token(),
       %(payload_hash)s, now() + make_interval(secs => %(ttl_s)s)
  FROM c
 WHERE NOT EXISTS (SELECT 1 FROM transcript.appends AS a
                    WHERE a.conversation_key = c.conversation_key
                      AND a.request_id = %(turn_id)s)
ON CONFLICT (conversation_key, turn_id) DO NOTHING
RETURNING ticket, lease_until
"""

_SHARE_CONVERSATION = """
SELECT conversation_key FROM transcript.conversations
 WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
   FOR KEY SHARE
"""

# Serializes the lease decisions of one turn id (shared ones run side by side).
_LOCK_TURN_ID = """
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s::text || '/' || %(turn_id)s, 0))
"""

# create_if_missing: the conversation, marked as made by this turn.
_INSERT_PROVISIONAL = """
INSERT INTO transcript.conversations (namespace, conversation_id, provisional_turn_id)
VALUES (%(namespace)s, %(conversation_id)s, %(turn_id)s)
ON CONFLICT (namespace, conversation_id) DO NOTHING
RETURNING conversation_key
"""

_DROP_LAPSED = """
DELETE FROM transcript.turns
 WHERE conversation_key = %(key)s AND turn_id <> %(turn_id)s
   AND state IN ('waiting', 'running') AND lease_until < now()
RETURNING state
"""

# The requested turn's row (any state), and every live waiting or running row.
_TURN_ROWS = """
SELECT turn_id, state, exclusive, ticket, payload_hash, lease_until >= now(), outcome, end_time
  FROM transcript.turns
 WHERE conversation_key = %(key)s
   AND (turn_id = %(turn_id)s OR (state IN ('waiting', 'running') AND lease_until >= now()))
"""

_PRIOR_APPEND = """
SELECT version, first_sequence, last_sequence, input_tokens, output_tokens, model_calls,
       commit_time, payload_hash
  FROM transcript.appends
 WHERE conversation_key = %(key)s AND request_id = %(turn_id)s
"""

# A place in the queue: the next ticket of the conversation.
_ENQUEUE = """
INSERT INTO transcript.turns
       (conversation_key, turn_id, state, exclusive, ticket, payload_hash, lease_until)
VALUES (%(key)s, %(turn_id)s, 'waiting', true, nextval('transcript.turn_tickets'),
        %(payload_hash)s, now() + make_interval(secs => %(wait_s)s))
ON CONFLICT (conversation_key, turn_id) DO UPDATE
   SET state = 'waiting', exclusive = true, ticket = excluded.ticket,
       payload_hash = excluded.payload_hash, lease_until = excluded.lease_until,
       outcome = NULL, end_time = NULL, create_time = now()
 WHERE transcript.turns.ticket = %(seen_ticket)s::bigint
RETURNING ticket
"""

_KEEP_PLACE = """
UPDATE transcript.turns SET lease_until = now() + make_interval(secs => %(wait_s)s)
 WHERE conversation_key = %(key)s AND turn_id = %(turn_id)s AND ticket = %(ticket)s
   AND state = 'waiting'
"""

# The lease: the next fencing token, the turn's row (replacing a waiting place or
# a lapsed lease) and, when exclusive, the fence on the conversation row.
_GRANT = """
WITH granted AS (
    INSERT INTO transcript.turns
           (conversation_key, turn_id, state, exclusive, ticket, payload_hash, lease_until)
    VALUES (%(key)s, %(turn_id)s, 'running', %(exclusive)s, transcript.random_token(),
            %(payload_hash)s, now() + make_interval(secs => %(ttl_s)s))
    ON CONFLICT (conversation_key, turn_id) DO UPDATE
       SET state = 'running', exclusive = excluded.exclusive, ticket = excluded.ticket,
           payload_hash = excluded.payload_hash, lease_until = excluded.lease_until,
           outcome = NULL, end_time = NULL, create_time = now()
     -- Only the row the decision saw (a lapsed lease, or this caller's place in line): a
     -- row a racing one-statement grant inserted meanwhile is never overwritten.
     WHERE transcript.turns.ticket = %(seen_ticket)s::bigint
    RETURNING ticket, lease_until
), fence AS (
    UPDATE transcript.conversations AS c
       SET lease_turn_id = %(turn_id)s, lease_token = g.ticket, lease_until = g.lease_until
      FROM granted AS g
     WHERE c.conversation_key = %(key)s AND %(exclusive)s
)
SELECT ticket, lease_until FROM granted
"""

_RENEW = f"""
WITH renewed AS (
    UPDATE transcript.turns
       SET lease_until = now() + make_interval(secs => %(ttl_s)s)
     WHERE conversation_key = {_KEY} AND turn_id = %(turn_id)s
       AND ticket = %(fencing_token)s AND state = 'running' AND lease_until >= now()
 RETURNING conversation_key, exclusive, lease_until
), fence AS (
    UPDATE transcript.conversations AS c SET lease_until = r.lease_until
      FROM renewed AS r
     WHERE c.conversation_key = r.conversation_key AND r.exclusive
       AND c.lease_token = %(fencing_token)s
)
SELECT exclusive, lease_until FROM renewed
"""

# Ends the turn's row if it still holds the lease (expired but not taken over
# counts: nobody else holds it): kept as 'ended' with its outcome, or deleted.
_END_TURN = """
WITH ended AS (
    UPDATE transcript.turns
       SET state = 'ended', outcome = %(outcome)s, end_time = now(),
           lease_until = now() + make_interval(secs => %(retention_s)s)
     WHERE conversation_key = %(key)s AND turn_id = %(turn_id)s
       AND ticket = %(fencing_token)s AND state = 'running' AND %(outcome)s::jsonb IS NOT NULL
 RETURNING 1
), dropped AS (
    DELETE FROM transcript.turns
     WHERE conversation_key = %(key)s AND turn_id = %(turn_id)s
       AND ticket = %(fencing_token)s AND state = 'running' AND %(outcome)s::jsonb IS NULL
 RETURNING 1
)
SELECT 1 FROM ended UNION ALL SELECT 1 FROM dropped
"""

_DROP_EXCLUSIVE = """
UPDATE transcript.conversations
   SET lease_turn_id = NULL, lease_token = NULL, lease_until = NULL
 WHERE conversation_key = %(key)s AND lease_token = %(fencing_token)s
"""

_NO_LIVE_TURN = """NOT EXISTS (
    SELECT 1 FROM transcript.turns AS t
     WHERE t.conversation_key = c.conversation_key
       AND t.state IN ('waiting', 'running') AND t.lease_until >= now())"""

_DROP_PROVISIONAL = f"""
WITH gone AS (
    DELETE FROM transcript.conversations AS c
     WHERE c.conversation_key = %(key)s AND c.provisional_turn_id = %(turn_id)s
       AND c.version = 0 AND {_NO_LIVE_TURN}
 RETURNING conversation_key
)
DELETE FROM transcript.turns WHERE conversation_key IN (SELECT conversation_key FROM gone)
"""

_SWEEP_TURNS = """
DELETE FROM transcript.turns
 WHERE ctid = ANY(ARRAY(
       SELECT ctid FROM transcript.turns
        WHERE lease_until < now() - CASE WHEN state IN ('ended', 'committed') THEN interval '0'
                                         ELSE make_interval(secs => %(grace_s)s) END
        ORDER BY lease_until
        LIMIT %(limit)s))
"""

# Empty conversations whose creating turn vanished without appending or releasing.
_SWEEP_PROVISIONAL = f"""
DELETE FROM transcript.conversations AS c
 WHERE c.conversation_key = ANY(ARRAY(
       SELECT c.conversation_key FROM transcript.conversations AS c
        WHERE c.provisional_turn_id IS NOT NULL AND c.version = 0
          AND c.create_time < now() - make_interval(secs => %(grace_s)s)
          AND {_NO_LIVE_TURN}
        LIMIT %(limit)s))
"""


# Entries of a conversation in two sequence ranges (the window and the summary
# buffer; an empty range when they merged). The conversation key is an InitPlan
# parameter, so each range is an index range scan on the (conversation_key,
# sequence) primary key: the cost is the number of entries returned, whatever
# the transcript's length (tests/integration checks the plan).
VIEW_ENTRIES_SQL = f"""
WITH c AS MATERIALIZED (
    SELECT conversation_key FROM transcript.conversations
     WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
)
SELECT {_ENTRY_COLUMNS}
  FROM transcript.entries AS e
 WHERE e.conversation_key = (SELECT conversation_key FROM c)
   AND e.sequence BETWEEN %(low1)s AND %(high1)s
UNION ALL
SELECT {_ENTRY_COLUMNS}
  FROM transcript.entries AS e
 WHERE e.conversation_key = (SELECT conversation_key FROM c)
   AND e.sequence BETWEEN %(low2)s AND %(high2)s
 ORDER BY 1
"""

# Everything a view needs in ONE statement and one snapshot: the counters, the
# prior append of a request id, and the two ranges of model.view_ranges (the
# window [low, last] and the naive summary buffer [through + 1, min(through +
# batch + 1, low - 1)]), computed here from the `last` this statement reads. The conversation row
# is an InitPlan, so each entry range is an index range scan on the
# (conversation_key, sequence) primary key: the cost is the number of entries
# returned, whatever the transcript's length (tests/integration checks the plan).
VIEW_SQL = f"""
WITH c AS MATERIALIZED (
    SELECT conversation_key, version, last_sequence, incarnation,
           greatest(1, last_sequence - %(window)s + 1) AS low
      FROM transcript.conversations
     WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
), a AS MATERIALIZED (
    SELECT version, first_sequence, last_sequence, input_tokens, output_tokens, model_calls,
           commit_time, payload_hash
      FROM transcript.appends
     WHERE conversation_key = (SELECT conversation_key FROM c)
       AND request_id = %(request_id)s
), e AS (
    SELECT {_ENTRY_COLUMNS}
      FROM transcript.entries AS e
     WHERE e.conversation_key = (SELECT conversation_key FROM c)
       AND e.sequence BETWEEN (SELECT low FROM c) AND (SELECT last_sequence FROM c)
    UNION ALL
    SELECT {_ENTRY_COLUMNS}
      FROM transcript.entries AS e
     WHERE e.conversation_key = (SELECT conversation_key FROM c)
       AND e.sequence BETWEEN %(through)s + 1
                          AND least(%(through)s + %(batch)s + 1, (SELECT low FROM c) - 1)
)
SELECT c.version, c.last_sequence, c.incarnation, a.*, e.*
  FROM c LEFT JOIN a ON true LEFT JOIN e ON true
 ORDER BY e.sequence
"""
