"""WatchConversation's reads in the store: the protocol (`FeedStore`) and its
PostgreSQL adapter; its SQL in statements.py. The notifications between processes
are bus.py's.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from services.common.domain import Entry
from services.common.postgres.pool import AsyncConn, Database, fetch_one
from services.transcript.config import ENTRY_OVERHEAD_BYTES
from services.transcript.conversations.model import Segment
from services.transcript.conversations.store import prefix_from_columns
from services.transcript.views.model import prefix_pieces
from services.transcript.views.store import entry_from_row
from services.transcript.watch import statements as sql
from services.transcript.watch.model import (
    AppendSlice,
    FeedState,
    Retraction,
    RunningTurn,
    Snapshot,
    TurnTrace,
)


class FeedStore(Protocol):
    """The reads of WatchConversation. Every method is one statement."""

    async def open_watch(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        after: int,
        incarnation: int,
        ttl_s: float,
        renew_before_s: float,
    ) -> Snapshot | None:
        """Return the conversation's counters (None when it is not in the namespace) and,
        when a stream from `after` on `incarnation` (0: any) can open, mark it watched for
        `ttl_s` (unless it is for `renew_before_s` more already)."""

    async def read_state(
        self,
        key: int,
        reported: Sequence[tuple[str, int]],
        after: int,
        max_entries: int,
        max_bytes: int,
        since: int = -1,
    ) -> FeedState | None:
        """In one snapshot: the counters, the running turns, a trace of each reported
        (turn id, fencing token), the first `max_entries` writes after version `since` (< 0:
        after the version of the append that wrote entry `after`) that retracted entries
        through `after` (past the first, about `max_entries` sequences in all), and the
        first page of entries after `after` (as read_entries through the last sequence);
        None when the conversation is gone."""

    async def read_entries(
        self, key: int, after: int, through: int, max_entries: int, max_bytes: int
    ) -> list[AppendSlice]:
        """The entries in (after, through], at most `max_entries` and, past the first,
        about `max_bytes`, grouped by the append that wrote them."""

    async def pulse(
        self, keys: Sequence[int], ttl_s: float, renew_before_s: float
    ) -> Mapping[int, Snapshot]:
        """The snapshots of the conversations that still exist among `keys`, renewing
        their marks as open_watch does (skipping rows a writer holds: next time)."""


def _snapshot(row: Sequence[Any]) -> Snapshot:
    key, version, last, incarnation, read_time, running = row
    return Snapshot(key, version, last, incarnation, read_time, tuple(running))


def _slices(rows: Sequence[Sequence[Any]]) -> list[AppendSlice]:
    """Entry rows (version, last_sequence, entry columns..., size) in sequence order,
    grouped by the append that wrote them."""
    groups: list[tuple[int, int, list[Entry], list[int]]] = []
    for version, last, *columns, size in rows:
        if not groups or groups[-1][0] != version:
            groups.append((version, last, [], [0]))
        groups[-1][2].append(entry_from_row(columns))
        groups[-1][3][0] += size
    return [
        AppendSlice(version, last, entries, size + len(entries) * ENTRY_OVERHEAD_BYTES)
        for version, last, entries, (size,) in groups
    ]


# The shared prefixes this process knows, by conversation key (a key is never reused and
# a prefix never changes): at most this many, the oldest forgotten first.
_PREFIXES_KEPT = 4096


class PostgresFeedStore:
    """FeedStore on PostgreSQL (schema `transcript`)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._prefixes: dict[int, tuple[Segment, ...]] = {}

    async def _prefix(self, conn: AsyncConn, key: int) -> tuple[Segment, ...]:
        """The shared prefix of conversation `key` (empty: no fork, or gone)."""
        if key in self._prefixes:
            return self._prefixes[key]
        row = await fetch_one(conn, sql.PREFIX, {"key": key})
        if row is None:
            return ()
        prefix = prefix_from_columns(*row)
        if len(self._prefixes) >= _PREFIXES_KEPT:
            del self._prefixes[next(iter(self._prefixes))]
        self._prefixes[key] = prefix
        return prefix

    async def _prefix_page(
        self,
        conn: AsyncConn,
        key: int,
        after: int,
        through: int,
        max_entries: int,
        max_bytes: int,
    ) -> list[AppendSlice] | None:
        """A page of a fork's shared prefix after `after` (None: the page lies after the
        prefix, in the conversation's own rows). An empty page: the fork was erased."""
        prefix = await self._prefix(conn, key)
        if not prefix or after >= prefix[-1].through_sequence:
            return None
        pieces = prefix_pieces(
            prefix, key, [(after + 1, min(through, prefix[-1].through_sequence))]
        )
        cursor = await conn.execute(
            sql.READ_PREFIX,
            {
                "keys": [p.key for p in pieces],
                "lows": [p.low for p in pieces],
                "highs": [p.high for p in pieces],
                "caps": [p.cap for p in pieces],
                "ends": [p.end for p in pieces],
                "next_keys": [p.next_key for p in pieces],
                "limit": max_entries,
                "with_versions": True,
                "max_bytes": max_bytes,
            },
        )
        return _slices(await cursor.fetchall())

    async def open_watch(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        after: int,
        incarnation: int,
        ttl_s: float,
        renew_before_s: float,
    ) -> Snapshot | None:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                sql.OPEN_WATCH,
                {
                    "namespace": namespace,
                    "conversation_id": conversation_id,
                    "after": after,
                    "incarnation": incarnation,
                    "ttl_s": ttl_s,
                    "renew_before_s": renew_before_s,
                },
            )
        return _snapshot(row) if row is not None else None

    async def read_state(
        self,
        key: int,
        reported: Sequence[tuple[str, int]],
        after: int,
        max_entries: int,
        max_bytes: int,
        since: int = -1,
    ) -> FeedState | None:
        async with self.db.connection() as conn:
            cursor = await sql.READ_STATE.execute(
                conn,
                {
                    "key": key,
                    "turn_ids": [turn_id for turn_id, _ in reported],
                    "fencing_tokens": [token for _, token in reported],
                    "after": after,
                    "since": since,
                    "limit": max_entries,
                    "max_bytes": max_bytes,
                },
            )
            rows = await cursor.fetchall()
            shared = (
                await self._prefix_page(conn, key, after, rows[0][1], max_entries, max_bytes)
                if rows
                else None
            )
        if not rows:
            return None
        version, last, incarnation, read_time = rows[0][:4]
        running: list[RunningTurn] = []
        traces: list[TurnTrace] = []
        retractions: list[Retraction] = []
        entry_rows: list[Sequence[Any]] = []
        for row in rows:
            kind, turn_id, token, exclusive, start_time, state, row_token, reason, committed = row[
                4:13
            ]
            if kind == "running":
                running.append(RunningTurn(turn_id, token, exclusive, start_time))
            elif kind == "traced":
                traces.append(TurnTrace(turn_id, token, state, row_token, reason, committed))
            elif kind == "retracted":
                retractions.append(Retraction(committed, tuple(sorted(set(row[13]))), start_time))
            elif kind == "entry":
                entry_rows.append(row[14:])
        tokens = tuple(sorted(turn.fencing_token for turn in running))
        snapshot = Snapshot(key, version, last, incarnation, read_time, tokens)
        entry_rows.sort(key=lambda row: int(row[2]))
        retractions.sort(key=lambda retraction: retraction.version)
        # A page that begins in a fork's shared prefix is read there (the stream reads on
        # from where it ends).
        page = shared if shared is not None else _slices(entry_rows)
        return FeedState(snapshot, running, traces, page, retractions)

    async def read_entries(
        self, key: int, after: int, through: int, max_entries: int, max_bytes: int
    ) -> list[AppendSlice]:
        async with self.db.connection() as conn:
            shared = await self._prefix_page(conn, key, after, through, max_entries, max_bytes)
            if shared is not None:
                return shared
            cursor = await conn.execute(
                sql.READ_ENTRIES,
                {
                    "key": key,
                    "after": after,
                    "through": through,
                    "limit": max_entries,
                    "max_bytes": max_bytes,
                },
            )
            return _slices(await cursor.fetchall())

    async def pulse(
        self, keys: Sequence[int], ttl_s: float, renew_before_s: float
    ) -> Mapping[int, Snapshot]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.PULSE, {"keys": list(keys), "ttl_s": ttl_s, "renew_before_s": renew_before_s}
            )
            return {row[0]: _snapshot(row) for row in await cursor.fetchall()}
