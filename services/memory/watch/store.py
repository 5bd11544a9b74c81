"""WatchMemories' reads in the store: the protocol (`FeedStore`) and its PostgreSQL
adapter; its SQL in statements.py. The changes themselves are numbered by the writes
(services/memory/writes/statements.py, `take_numbers`); the notifications between
processes are services/common/postgres/notify.py's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from services.common.postgres.pool import Database, fetch_one
from services.memory.model import Memory
from services.memory.rows import sources_from_json
from services.memory.watch import statements as sql
from services.memory.watch.model import REMOVALS, Changed, ChangePage, Head, kind_of


class FeedStore(Protocol):
    """The reads of WatchMemories. Every method is one statement."""

    async def open_watch(self, namespace: str, ttl_s: float, renew_before_s: float) -> Head:
        """The namespace's head (its feed made, at 0, if it never changed), marked watched
        for `ttl_s` (unless it is for `renew_before_s` more already)."""

    async def last_change_sequence(self, namespace: str) -> int:
        """The namespace's last change (0 when it never changed), written nowhere."""

    async def read_changes(
        self, key: int, namespace: str, after: int, max_changes: int, max_bytes: int
    ) -> ChangePage:
        """In one snapshot: the head of the namespace's feed (`key`), and its first
        `max_changes` changes after `after`, past the first about `max_bytes` in all."""

    async def pulse(
        self, keys: Sequence[int], ttl_s: float, renew_before_s: float
    ) -> Mapping[int, Head]:
        """The heads of the feeds `keys`, renewing their marks as open_watch does
        (skipping rows a writer holds: next time)."""


def _change(namespace: str, row: Sequence[Any]) -> Changed:
    """A change from the columns of READ_CHANGES after the head's."""
    (
        sequence,
        kind,
        reason,
        memory_id,
        revision,
        recorded_at,
        _size,
        content,
        sources,
        metadata,
        expire_time,
        valid_from_time,
        valid_until_time,
        superseded_by,
        create_time,
        model,
        dimension,
    ) = row
    change = kind_of(kind, reason)
    memory = None
    if change not in REMOVALS and content is not None:
        memory = Memory(
            namespace=namespace,
            memory_id=memory_id,
            content=content,
            sources=sources_from_json(sources),
            metadata=metadata or {},
            revision=revision,
            # The live row's (the same incarnation: a removal erases its history's content).
            create_time=create_time or recorded_at,
            update_time=recorded_at,
            expire_time=expire_time,
            embedding_model=model or "",
            embedding_dimension=dimension or 0,
            valid_from_time=valid_from_time,
            valid_until_time=valid_until_time,
            superseded_by=superseded_by,
        )
    return Changed(sequence, change, memory_id, revision, recorded_at, memory)


class PostgresFeedStore:
    """FeedStore on PostgreSQL (schema `memory`)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def open_watch(self, namespace: str, ttl_s: float, renew_before_s: float) -> Head:
        params = {"namespace": namespace, "ttl_s": ttl_s, "renew_before_s": renew_before_s}
        async with self.db.connection() as conn:
            # Twice at most: the second statement's snapshot sees the row another open
            # committed while the first waited for it.
            for _ in range(2):
                row = await fetch_one(conn, sql.OPEN_WATCH, params)
                if row is not None:
                    return Head(*row)
        raise RuntimeError("the namespace's feed row is neither made nor found")

    async def last_change_sequence(self, namespace: str) -> int:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                "SELECT last_change_sequence FROM memory.feeds WHERE namespace = %s",
                (namespace,),
            )
        return int(row[0]) if row is not None else 0

    async def read_changes(
        self, key: int, namespace: str, after: int, max_changes: int, max_bytes: int
    ) -> ChangePage:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.READ_CHANGES,
                {
                    "key": key,
                    "namespace": namespace,
                    "after": after,
                    "limit": max_changes,
                    "max_bytes": max_bytes,
                },
            )
            rows = await cursor.fetchall()
        if not rows:
            raise RuntimeError("a watched namespace's feed row is gone")
        head = Head(key, rows[0][0], rows[0][1])
        found = [row[2:] for row in rows if row[2] is not None]
        return ChangePage(
            head, [_change(namespace, row) for row in found], [int(row[6]) for row in found]
        )

    async def pulse(
        self, keys: Sequence[int], ttl_s: float, renew_before_s: float
    ) -> Mapping[int, Head]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.PULSE, {"keys": list(keys), "ttl_s": ttl_s, "renew_before_s": renew_before_s}
            )
            return {row[0]: Head(*row) for row in await cursor.fetchall()}
