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
from services.common.postgres.pool import AsyncConn
from services.transcript.conversations.model import Segment, conversation_not_found
from services.transcript.conversations.store import (
    PostgresBase,
    conversation_from_row,
    prefix_from_columns,
    record_from_row,
)
from services.transcript.views import statements as sql
from services.transcript.views.model import ViewRead, merge_ranges, prefix_pieces, view_ranges


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


async def read_prefix(
    conn: AsyncConn,
    prefix: Sequence[Segment],
    own_key: int,
    ranges: Sequence[tuple[int, int]],
    limit: int,
    with_versions: bool = False,
) -> Sequence[Sequence[Any]]:
    """The rows of the entries of a fork's shared prefix that lie in the inclusive ranges,
    in sequence order, at most `limit`: (version, append's last sequence, entry columns...,
    size), the versions only `with_versions` (else NULL). One statement, one index range
    scan per segment a range crosses: the cost is the rows returned, whatever the prefix's
    length. CONVERSATION_NOT_FOUND when rows are missing: the prefix never changes while
    the fork exists, so its lineage was erased meanwhile (and the fork with it)."""
    pieces = prefix_pieces(prefix, own_key, ranges)
    if not pieces:
        return []
    cursor = await conn.execute(
        sql.PREFIX_ENTRIES,
        {
            "keys": [p.key for p in pieces],
            "lows": [p.low for p in pieces],
            "highs": [p.high for p in pieces],
            "caps": [p.cap for p in pieces],
            "ends": [p.end for p in pieces],
            "next_keys": [p.next_key for p in pieces],
            "limit": limit,
            "with_versions": with_versions,
        },
    )
    rows = await cursor.fetchall()
    if len(rows) != min(limit, sum(p.high - p.low + 1 for p in pieces)):
        raise conversation_not_found()
    return rows


def prefix_ranges(prefix_end: int, ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of the inclusive ranges that lie in a prefix ending at `prefix_end`."""
    return merge_ranges([(low, min(high, prefix_end)) for low, high in ranges])


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
            rows = await cursor.fetchall()
            if not rows:
                return []
            key, keys, throughs, versions = rows[0][:4]
            entries = [entry_from_row(row[4:]) for row in rows if row[4] is not None]
            prefix = prefix_from_columns(keys, throughs, versions)
            if prefix:
                shared = prefix_ranges(prefix[-1].through_sequence, ranges)
                if shared:
                    read = await read_prefix(conn, prefix, key, shared, SEQUENCE_MAX)
                    entries = [entry_from_row(row[2:12]) for row in read] + entries
        return entries

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
            conversation = conversation_from_row(first[21:38])
            if conversation.prefix:
                # A fork: what the view reads of its shared prefix lies in its lineage's rows.
                ranges = view_ranges(first[1], window, summary_batch, summarized_through)
                shared = prefix_ranges(conversation.prefix_end, ranges)
                if shared:
                    read = await read_prefix(
                        conn, conversation.prefix, first[38], shared, SEQUENCE_MAX
                    )
                    entries = sorted(
                        [entry_from_row(row[2:12]) for row in read] + entries,
                        key=lambda entry: entry.sequence,
                    )
        return ViewRead(first[0], first[1], entries, prior, first[2], conversation)

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
            if not rows:
                return None
            entries = [entry_from_row(row[3:]) for row in rows if row[3] is not None]
            prefix = prefix_from_columns(*rows[0][:3])
            # A fork's retractions are of its own entries (its shared prefix's are its
            # source's writes, at or before the fork point): no prefix to read for them.
            shares = not retracted_after_version
            if shares and prefix and after_sequence < prefix[-1].through_sequence:
                # A fork: the page begins in its shared prefix, in its lineage's rows.
                high = prefix[-1].through_sequence
                if through_sequence is not None:
                    high = min(high, through_sequence)
                if after_sequence < high:
                    read = await read_prefix(conn, prefix, 0, [(after_sequence + 1, high)], limit)
                    entries = ([entry_from_row(row[2:12]) for row in read] + entries)[:limit]
        return entries
