"""The reads of entries in the store: the protocol (`ViewStore`) and its PostgreSQL
adapter. A view is one statement and one snapshot; its cost grows with the window and
the batch, never with the transcript's length (tests/transcript/views/test_views_store.py
checks the plans).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Protocol

from services.common.domain import SEQUENCE_MAX, Entry, Message, Role, ToolCall
from services.transcript.conversations.store import (
    PostgresBase,
    conversation_from_row,
    read_conversation,
    record_from_row,
)
from services.transcript.views import statements as sql
from services.transcript.views.model import ViewRead


class ViewStore(Protocol):
    """The reads of entries of TranscriptStore (each one consistent read)."""

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
        retracted_after_version: int = 0,
    ) -> list[Entry] | None:
        """Up to `limit` entries after a sequence (only those a write after
        `retracted_after_version` retracted, when it is not 0); None when the conversation
        is missing."""


def entry_from_row(row: Sequence[Any]) -> Entry:
    """An entry from its columns (sql.ENTRY_COLUMNS)."""
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


class PostgresViews(PostgresBase):
    """ViewStore on PostgreSQL (schema `transcript`)."""

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
            return [entry_from_row(row) for row in await cursor.fetchall()]

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
        entries = [entry_from_row(row[11:21]) for row in rows if row[11] is not None]
        return ViewRead(
            first[0], first[1], entries, prior, first[2], conversation_from_row(first[21:])
        )

    async def list_entries(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        after_sequence: int,
        through_sequence: int | None,
        limit: int,
        retracted_after_version: int = 0,
    ) -> list[Entry] | None:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.LIST_RETRACTED_ENTRIES if retracted_after_version else sql.LIST_ENTRIES,
                {
                    "namespace": namespace,
                    "conversation_id": conversation_id,
                    "after": after_sequence,
                    "limit": limit,
                    "through": SEQUENCE_MAX if through_sequence is None else through_sequence,
                    "retracted_after": retracted_after_version,
                },
            )
            rows = await cursor.fetchall()
            if not rows and await read_conversation(conn, namespace, conversation_id) is None:
                return None
        return [entry_from_row(row) for row in rows]
