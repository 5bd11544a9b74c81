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
from services.common.db import Database
from services.common.domain import SEQUENCE_MAX, Entry, Message, Role, ToolCall
from services.common.errors import VersionConflict
from services.transcript import statements as sql
from services.transcript.lease_store import PostgresTurnLeases, TurnLeaseStore, record_from_row
from services.transcript.model import (
    AppendRecord,
    AppendResult,
    Conversation,
    NewAppend,
    ViewRead,
    conversation_busy,
    conversation_not_found,
    request_id_reused,
    turn_lease_lost,
)


class TranscriptStore(TurnLeaseStore, Protocol):
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


class PostgresTranscriptStore(PostgresTurnLeases):
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
                    RETURNING {sql.CONVERSATION_COLUMNS}""",
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
                cursor = await conn.execute(sql.APPEND, params)
                row = await cursor.fetchone()
            except psycopg.errors.UniqueViolation:
                row = None  # the request id is recorded: nothing was written; replay below
            if row is not None:
                version, last, commit_time, key, watched = row
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
        self, namespace: str, after: uuid.UUID | None, limit: int
    ) -> list[Conversation]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                f"""SELECT {sql.CONVERSATION_COLUMNS} FROM transcript.conversations
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
