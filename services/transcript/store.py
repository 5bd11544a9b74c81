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

from services.common.domain import SEQUENCE_MAX, Entry, Message, Role, ToolCall
from services.common.errors import VersionConflict
from services.common.postgres.pool import Database
from services.transcript import metrics
from services.transcript import statements as sql
from services.transcript.lease_store import PostgresTurnLeases, TurnLeaseStore, record_from_row
from services.transcript.model import (
    NO_STATE_CHANGE,
    AppendRecord,
    AppendResult,
    Conversation,
    NewAppend,
    ScopedState,
    StateChange,
    ViewRead,
    conversation_busy,
    conversation_not_found,
    entry_not_retractable,
    no_user,
    request_id_reused,
    state_too_large,
    turn_lease_lost,
)


class TranscriptStore(TurnLeaseStore, Protocol):
    """What the transcript service needs from a store. Every method is atomic."""

    async def create_conversation(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        labels: Mapping[str, str],
        user_id: str | None = None,
        state: StateChange = NO_STATE_CHANGE,
        max_state_bytes: int = 64 * 1024,
    ) -> tuple[Conversation, bool]:
        """Insert unless it exists, with the initial state (and the user's and the
        namespace's changes, all in one transaction); return it and whether it was
        created. STATE_TOO_LARGE when a changed document would exceed the limit."""

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
        self,
        namespace: str,
        after: uuid.UUID | None,
        limit: int,
        user_id: str | None = None,
        with_state: bool = False,
    ) -> list[Conversation]:
        """Conversations of a namespace (of one user, when given) in id order, after a
        cursor; their state only when asked (else state_json is "")."""

    async def read_states(self, namespace: str, user_ids: Sequence[str]) -> list[ScopedState]:
        """The stored state documents among these users' ("" for the namespace's)."""

    async def delete_conversation(
        self, namespace: str, conversation_id: uuid.UUID, incarnation: int = 0
    ) -> int | None:
        """Erase it (only that incarnation, when given); return the number of entries
        erased, or None if it did not exist."""


def _conversation(row: Sequence[Any]) -> Conversation:
    return Conversation(
        row[0], row[1], row[2], row[3], row[4], row[5], row[6] or {}, row[7], row[8], row[9]
    )


def _entry(row: Sequence[Any]) -> Entry:
    (
        sequence,
        role,
        text,
        tool_calls,
        tool_call_id,
        metadata,
        created_at,
        native_json,
        retracted_version,
        retract_time,
    ) = row
    return Entry(
        sequence=sequence,
        message=Message(
            role=Role(role),
            text=text,
            tool_calls=tuple(ToolCall(*call) for call in tool_calls or ()),
            tool_call_id=tool_call_id or "",
            metadata=metadata or {},
            native_json=native_json or "",
        ),
        created_at=created_at,
        retracted_version=retracted_version or 0,
        retract_time=retract_time,
    )


def state_parameters(state: StateChange) -> dict[str, Any]:
    """A write's state changes as statement parameters (JSON text, cast to jsonb there)."""
    return {
        "conversation_state": state.conversation,
        "user_state": state.user,
        "namespace_state": state.namespace,
    }


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
        "retract": list(append.retract) or None,
        "max_state_bytes": append.max_state_bytes,
        **state_parameters(append.state),
    }


class PostgresTranscriptStore(PostgresTurnLeases):
    """TranscriptStore on PostgreSQL (schema `transcript`)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def create_conversation(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        labels: Mapping[str, str],
        user_id: str | None = None,
        state: StateChange = NO_STATE_CHANGE,
        max_state_bytes: int = 64 * 1024,
    ) -> tuple[Conversation, bool]:
        params = {
            "namespace": namespace,
            "conversation_id": conversation_id,
            "labels": Jsonb(dict(labels)),
            "user_id": user_id,
            "max_state_bytes": max_state_bytes,
            **state_parameters(state),
        }
        async with self.db.connection() as conn:
            cursor = await conn.execute(sql.CREATE_CONVERSATION, params)
            row = await cursor.fetchone()
            if row is not None:
                return _conversation(row), True
            existing = await self._get(conn, namespace, conversation_id)
            if existing is None and state:
                cursor = await conn.execute(sql.CREATED_STATE_TOO_LARGE, params)
                too_large = await cursor.fetchone()
                if too_large is not None and too_large[0]:
                    raise state_too_large("user", max_state_bytes)
                if too_large is not None and too_large[1]:
                    raise state_too_large("namespace", max_state_bytes)
        if existing is None:  # deleted between the two statements
            raise conversation_not_found()
        return existing, False

    async def _get(
        self, conn: Any, namespace: str, conversation_id: uuid.UUID
    ) -> Conversation | None:
        cursor = await conn.execute(
            f"""SELECT {sql.CONVERSATION_COLUMNS} FROM transcript.conversations
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
                cursor = await sql.APPEND.execute(conn, params)
                row = await cursor.fetchone()
            except psycopg.errors.UniqueViolation:
                row = None  # the request id is recorded: nothing was written; replay below
            if row is not None:
                version, last, commit_time, user_version, namespace_version, key, watched = row
                self.changed(key, watched)
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
                    user_state_version=user_version or 0,
                    namespace_state_version=namespace_version or 0,
                )
            cursor = await conn.execute(sql.WHY_NOT_APPENDED, params)
            why = await cursor.fetchone()
        if why is None:
            raise conversation_not_found()
        if why[1] is not None:
            record = record_from_row(why[1:9])
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
        if append.expected_version is None or why[0] == append.expected_version:
            # At the version the write expected (or at any): a rule of its own refused it.
            no_user_set, unretractable, *too_large = why[13:18]
            if append.state.user is not None and no_user_set:
                raise no_user()
            if unretractable is not None:
                raise entry_not_retractable(unretractable)
            scopes = ("conversation", "user", "namespace")
            for scope, exceeded in zip(scopes, too_large, strict=True):
                if exceeded:
                    raise state_too_large(scope, append.max_state_bytes)
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
                sql.VIEW_ENTRIES_SQL,
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
                sql.VIEW_SQL,
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
        prior = record_from_row(first[3:11]) if first[3] is not None else None
        entries = [_entry(row[11:21]) for row in rows if row[11] is not None]
        return ViewRead(first[0], first[1], entries, prior, first[2], _conversation(first[21:]))

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
                f"""SELECT {sql.ENTRY_COLUMNS}
                      FROM transcript.entries AS e
                     WHERE e.conversation_key = {sql.KEY}
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
        self,
        namespace: str,
        after: uuid.UUID | None,
        limit: int,
        user_id: str | None = None,
        with_state: bool = False,
    ) -> list[Conversation]:
        columns = sql.CONVERSATION_COLUMNS if with_state else sql.CONVERSATION_BASIC_COLUMNS
        # Two statements rather than an `IS NULL OR` filter: each is one index range
        # scan in id order (the user's the partial index conversations_user).
        where = "namespace = %(namespace)s"
        if user_id is not None:
            where += " AND user_id = %(user_id)s"
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                f"""SELECT {columns} FROM transcript.conversations
                     WHERE {where}
                       AND (%(after)s::uuid IS NULL OR conversation_id > %(after)s::uuid)
                     ORDER BY conversation_id
                     LIMIT %(limit)s""",
                {"namespace": namespace, "user_id": user_id, "after": after, "limit": limit},
            )
            return [_conversation(row) for row in await cursor.fetchall()]

    async def read_states(self, namespace: str, user_ids: Sequence[str]) -> list[ScopedState]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                """SELECT user_id, state::text, version, update_time
                     FROM transcript.scoped_states
                    WHERE namespace = %s AND user_id = ANY(%s::text[])""",
                (namespace, list(user_ids)),
            )
            return [ScopedState(*row) for row in await cursor.fetchall()]

    async def delete_conversation(
        self, namespace: str, conversation_id: uuid.UUID, incarnation: int = 0
    ) -> int | None:
        async with self.db.connection() as conn, conn.transaction():
            cursor = await conn.execute(
                f"""DELETE FROM transcript.conversations
                    WHERE namespace = %s AND conversation_id = %s
                      AND (%s::bigint = 0 OR incarnation = %s::bigint)
                RETURNING conversation_key, {sql.WATCHED}""",
                (namespace, conversation_id, incarnation, incarnation),
            )
            row = await cursor.fetchone()
            if row is None:
                return None
            key, watched = row
            await conn.execute("DELETE FROM transcript.appends WHERE conversation_key = %s", (key,))
            await conn.execute("DELETE FROM transcript.turns WHERE conversation_key = %s", (key,))
            cursor = await conn.execute(
                "DELETE FROM transcript.entries WHERE conversation_key = %s", (key,)
            )
            deleted: int = cursor.rowcount
        self.changed(key, watched)
        return deleted
