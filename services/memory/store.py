"""Memory persistence: the store protocol and its PostgreSQL adapter (schema `memory`).

Every write is ONE SQL statement in autocommit: the change to the memory row,
its history row and its outbox row are written together or not at all, so
the index can never miss a write (transactional outbox). Only when the
statement wrote nothing do we look at why.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

import psycopg
from psycopg.types.json import Jsonb

from services.common.db import AsyncConn, Database, fetch_one
from services.memory import statements as sql
from services.memory.inputs import invalid_validity
from services.memory.model import (
    Memory,
    MemoryWrite,
    RevisionRecord,
    ScoredMemory,
    WriteResult,
    memory_exists,
    memory_not_found,
    request_id_reused,
    revision_conflict,
    source_not_found,
    superseded_conflict,
    superseded_not_found,
    supersedes_later_fact,
    supersession_cycle,
    validity_ended,
)
from services.memory.outbox_store import OutboxStore, PostgresOutbox
from services.memory.rows import COLUMN_COUNT, memory_from_row, sources_from_json, sources_json

# Erasure tombstones are kept this long: far longer than a source check and its write
# can be apart (a request's deadline is minutes at most).
ERASURE_RETENTION_S = 7 * 24 * 3600.0


class MemoryStore(OutboxStore, Protocol):
    """What the memory service needs from a store. Every method is atomic."""

    async def create(self, write: MemoryWrite) -> WriteResult:
        """Insert a memory; MEMORY_ALREADY_EXISTS if its id is live in the namespace.

        Every write (create and update) is refused with SOURCE_NOT_FOUND when one of
        `write.source_incarnations` was fenced by an erasure, and with a request id
        it replays the request's first result (REQUEST_ID_REUSED for another
        payload: the replay reports the memory only, not what it superseded).

        Every write also supersedes `write.supersedes` in its transaction: each
        must be live in the namespace (MEMORY_NOT_FOUND), at its expected revision
        if one is given (REVISION_CONFLICT), open (VALIDITY_ENDED), valid from
        before the written memory (SUPERSEDES_LATER_FACT), and not one of the
        written memory's successors (SUPERSESSION_CYCLE); each gets a new revision
        with `valid_until_time` = the written memory's `valid_from_time` and
        `superseded_by` = the written memory. Any refusal writes nothing."""

    async def update(self, write: MemoryWrite) -> WriteResult:
        """Replace a live memory at `write.expected_revision`; NOT_FOUND or REVISION_CONFLICT
        (and the rules of `create` on fences, request ids and supersession). Validity not
        given is kept; a validity that would end before it starts is INVALID_VALIDITY."""

    async def get(self, namespace: str, memory_id: uuid.UUID) -> Memory | None:
        """The live memory, or None (also when expired or in another namespace)."""

    async def get_many(
        self,
        namespace: str,
        memory_ids: Sequence[uuid.UUID],
        metadata: Mapping[str, str],
        valid_at: datetime | None = None,
    ) -> list[Memory]:
        """The live memories among `memory_ids` whose metadata holds every pair given
        (and, with `valid_at`, valid at that time)."""

    async def list_memories(
        self,
        namespace: str,
        conversation_id: uuid.UUID | None,
        after: uuid.UUID | None,
        limit: int,
        valid_at: datetime | None = None,
    ) -> list[Memory]:
        """Live memories in id order after a cursor, optionally with a source in a conversation
        and valid at `valid_at` (None: whatever their validity)."""

    async def delete(
        self, namespace: str, memory_id: uuid.UUID, expected_revision: int | None
    ) -> bool:
        """Erase a memory; False if it was not live; REVISION_CONFLICT on a stale revision."""

    async def forget_source(
        self, namespace: str, conversation_id: uuid.UUID, low: int, high: int, incarnation: int = 0
    ) -> int:
        """Erase every memory with a source range of the conversation overlapping [low, high];
        with an `incarnation`, fence it first (later writes naming it are refused)."""

    async def sweep_requests(self, older_than_s: float) -> int:
        """Forget request ids recorded more than `older_than_s` ago, and erasure tombstones
        older than ERASURE_RETENTION_S."""

    async def sweep_expired(self, limit: int) -> int:
        """Erase up to `limit` expired memories; return how many."""

    async def text_search(
        self,
        namespace: str,
        query: str,
        metadata: Mapping[str, str],
        limit: int,
        valid_at: datetime | None = None,
    ) -> list[ScoredMemory]:
        """Full-text search over live memories valid at `valid_at` (the degraded mode);
        rank as score."""

    async def history(
        self,
        namespace: str,
        memory_id: uuid.UUID,
        after_revision: int = 0,
        limit: int | None = None,
    ) -> list[RevisionRecord]:
        """The revisions of a memory id in the namespace after `after_revision`, oldest
        first, at most `limit` of them (None: all)."""


# --- PostgreSQL -------------------------------------------------------------


async def _fence(conn: AsyncConn, write: MemoryWrite) -> WriteResult | None:
    """Inside the write's transaction: lock its source conversations (in a fixed order),
    refuse the write if an erasure fenced one of them, and claim its request id (or return
    the first result of that request). Runs before the write statement, whose snapshot
    then sees every erasure that took the lock first."""
    for cid in sorted(write.source_incarnations):
        await conn.execute(sql.LOCK_CONVERSATION, (write.namespace, str(cid)))
    if write.source_incarnations:
        cids = sorted(write.source_incarnations)
        erased = await fetch_one(
            conn,
            """SELECT 1 FROM memory.erasures
                WHERE namespace = %s
                  AND (conversation_id, incarnation) IN (
                      SELECT * FROM unnest(%s::uuid[], %s::bigint[]))""",
            (write.namespace, cids, [write.source_incarnations[c] for c in cids]),
        )
        if erased is not None:
            raise source_not_found()
    if write.request_id is None:
        return None
    claimed = await fetch_one(
        conn,
        """INSERT INTO memory.requests (namespace, request_id, payload_hash)
           VALUES (%s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1""",
        (write.namespace, write.request_id, write.payload_hash),
    )
    if claimed is not None:
        return None
    row = await fetch_one(
        conn,
        """SELECT payload_hash, memory_id, revision, created FROM memory.requests
            WHERE namespace = %s AND request_id = %s""",
        (write.namespace, write.request_id),
    )
    assert row is not None  # a recorded request is only removed by the retention sweep
    digest, memory_id, revision, created = row
    if bytes(digest) != write.payload_hash:
        raise request_id_reused()
    return WriteResult(await _replayed(conn, write.namespace, memory_id, revision), bool(created))


async def _recorded(
    conn: AsyncConn,
    write: MemoryWrite,
    memory: Memory,
    locked: Mapping[uuid.UUID, Sequence[Any]],
    *,
    created: bool,
) -> WriteResult:
    """Supersede what the write names (rows locked by `_lock_superseded`), and record the
    write's result under its request id (claimed by `_fence`)."""
    superseded = await _supersede(conn, write, memory, locked)
    if write.request_id is not None:
        await conn.execute(
            """UPDATE memory.requests SET memory_id = %s, revision = %s, created = %s
                WHERE namespace = %s AND request_id = %s""",
            (memory.memory_id, memory.revision, created, write.namespace, write.request_id),
        )
    return WriteResult(memory, created, superseded)


async def _lock_superseded(
    conn: AsyncConn, write: MemoryWrite, *, updating: bool
) -> dict[uuid.UUID, Sequence[Any]]:
    """Before the write: lock the superseded memories (and, on an update, the written one)
    in id order, so that racing supersessions that share memories cannot deadlock.
    Returns the state of each superseded memory found live: (memory_id, revision,
    valid_from_time, valid_until_time, superseded_by)."""
    if not write.supersedes:
        return {}
    ids = [s.memory_id for s in write.supersedes]
    cursor = await conn.execute(
        sql.LOCK_FOR_SUPERSESSION,
        {"namespace": write.namespace, "ids": [*ids, write.memory_id] if updating else ids},
    )
    return {row[0]: row for row in await cursor.fetchall() if row[0] != write.memory_id}


async def _supersede(
    conn: AsyncConn, write: MemoryWrite, memory: Memory, locked: Mapping[uuid.UUID, Sequence[Any]]
) -> list[Memory]:
    """Close the validity of the memories `write` supersedes, after checking each (see
    MemoryStore.create); raises, rolling the whole write back, on the first refusal."""
    if not write.supersedes:
        return []
    valid_from = memory.valid_from_time
    assert valid_from is not None  # the column is NOT NULL
    for i, wanted in enumerate(write.supersedes):
        state = locked.get(wanted.memory_id)
        if state is None:
            raise superseded_not_found(i)
        _, revision, their_from, their_until, their_successor = state
        if wanted.expected_revision is not None and revision != wanted.expected_revision:
            raise superseded_conflict(i, revision, wanted.expected_revision)
        if their_until is not None:
            raise validity_ended(i, their_successor)
        if their_from >= valid_from:
            raise supersedes_later_fact(i)
    ids = [s.memory_id for s in write.supersedes]
    params = {"namespace": write.namespace, "memory_id": memory.memory_id, "ids": ids}
    # Read after the locks (a fresh snapshot in READ COMMITTED): a racing supersession
    # that shares a memory with this one has committed by now, or waits for it.
    looped = await fetch_one(conn, sql.SUCCESSOR_IN, params)
    if looped is not None:
        raise supersession_cycle(ids.index(looped[0]))
    cursor = await conn.execute(
        sql.SUPERSEDE,
        {**params, "valid_until": valid_from, "superseded_by": memory.memory_id},
    )
    by_id = {m.memory_id: m for m in (memory_from_row(row) for row in await cursor.fetchall())}
    return [by_id[i] for i in ids]


async def _replayed(conn: AsyncConn, namespace: str, memory_id: uuid.UUID, revision: int) -> Memory:
    """The memory as a recorded request wrote it: the live memory when it is still at that
    revision, else that revision from the history; MEMORY_NOT_FOUND once deleted (its
    history keeps no content)."""
    row = await fetch_one(
        conn,
        f"""SELECT {sql.COLUMNS} FROM memory.memories
             WHERE namespace = %s AND memory_id = %s AND revision = %s AND {sql.LIVE}""",
        (namespace, memory_id, revision),
    )
    if row is not None:
        return memory_from_row(row)
    old = await fetch_one(
        conn,
        """SELECT h.content, h.sources, h.metadata, h.expire_time, h.recorded_at,
                  m.embedding_model, m.embedding_dimension,
                  h.valid_from_time, h.valid_until_time, h.superseded_by
             FROM memory.revisions AS h
             LEFT JOIN memory.memories AS m USING (namespace, memory_id)
            WHERE h.namespace = %s AND h.memory_id = %s AND h.revision = %s
              AND h.content IS NOT NULL""",
        (namespace, memory_id, revision),
    )
    if old is None:
        raise memory_not_found()
    content, sources, metadata, expire_time, recorded_at, model, dimension = old[:7]
    return memory_from_row(
        (
            namespace,
            memory_id,
            content,
            sources,
            metadata,
            revision,
            recorded_at,
            recorded_at,
            expire_time,
            model or "",
            dimension or 0,
            *old[7:],
        )
    )


def _write_params(write: MemoryWrite) -> dict[str, Any]:
    return {
        "namespace": write.namespace,
        "memory_id": write.memory_id,
        "content": write.content,
        "sources": Jsonb(sources_json(write.sources)),
        "metadata": Jsonb(dict(write.metadata)),
        "expected_revision": write.expected_revision,
        "expire_time": write.expire_time,
        "model": write.embedding_model,
        "dimension": write.embedding_dimension,
        "valid_from": write.valid_from_time,
        "valid_until": write.valid_until_time,
    }


class PostgresMemoryStore(PostgresOutbox):
    """MemoryStore on PostgreSQL (schema `memory`)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def create(self, write: MemoryWrite) -> WriteResult:
        params = _write_params(write)
        async with self.db.connection() as conn, conn.transaction():
            replayed = await _fence(conn, write)
            if replayed is not None:
                return replayed
            locked = await _lock_superseded(conn, write, updating=False)
            for _ in range(2):
                row = await fetch_one(conn, sql.CREATE, params)
                if row is not None:
                    return await _recorded(conn, write, memory_from_row(row), locked, created=True)
                # The id is taken. A lapsed memory the sweeper has not reached
                # yet is gone for every reader: erase it, then create again.
                erased = await fetch_one(
                    conn,
                    sql.ERASE.format(victims=sql.BY_ID, extra=f"AND NOT {sql.LIVE}"),
                    {**params, "reason": "expired"},
                )
                if erased is None:
                    break
        raise memory_exists()

    async def update(self, write: MemoryWrite) -> WriteResult:
        params = _write_params(write)
        try:
            async with self.db.connection() as conn, conn.transaction():
                replayed = await _fence(conn, write)
                if replayed is not None:
                    return replayed
                locked = await _lock_superseded(conn, write, updating=True)
                row = await fetch_one(conn, sql.UPDATE, params)
                if row is not None:
                    return await _recorded(conn, write, memory_from_row(row), locked, created=False)
                current = await fetch_one(conn, sql.CURRENT_REVISION, params)
        except psycopg.errors.CheckViolation as exc:
            # The validity given, with the one kept, would end before it starts.
            if exc.diag.constraint_name == "memories_validity":
                raise invalid_validity() from None
            raise
        if current is None:
            raise memory_not_found()
        assert write.expected_revision is not None
        raise revision_conflict(current[0], write.expected_revision)

    async def get(self, namespace: str, memory_id: uuid.UUID) -> Memory | None:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                f"""SELECT {sql.COLUMNS} FROM memory.memories
                     WHERE namespace = %s AND memory_id = %s AND {sql.LIVE}""",
                (namespace, memory_id),
            )
        return memory_from_row(row) if row else None

    async def get_many(
        self,
        namespace: str,
        memory_ids: Sequence[uuid.UUID],
        metadata: Mapping[str, str],
        valid_at: datetime | None = None,
    ) -> list[Memory]:
        if not memory_ids:
            return []
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                f"""SELECT {sql.COLUMNS} FROM memory.memories
                     WHERE namespace = %(namespace)s AND memory_id = ANY(%(ids)s) AND {sql.LIVE}
                       AND metadata @> %(metadata)s AND {sql.VALID_AT}""",
                {
                    "namespace": namespace,
                    "ids": list(memory_ids),
                    "metadata": Jsonb(dict(metadata)),
                    "valid_at": valid_at,
                },
            )
            return [memory_from_row(row) for row in await cursor.fetchall()]

    async def list_memories(
        self,
        namespace: str,
        conversation_id: uuid.UUID | None,
        after: uuid.UUID | None,
        limit: int,
        valid_at: datetime | None = None,
    ) -> list[Memory]:
        containment = Jsonb([{"c": str(conversation_id)}]) if conversation_id else None
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                f"""SELECT {sql.COLUMNS} FROM memory.memories
                     WHERE namespace = %(namespace)s AND {sql.LIVE} AND {sql.VALID_AT}
                       AND (%(after)s::uuid IS NULL OR memory_id > %(after)s::uuid)
                       AND (%(containment)s::jsonb IS NULL OR sources @> %(containment)s::jsonb)
                     ORDER BY memory_id
                     LIMIT %(limit)s""",
                {
                    "namespace": namespace,
                    "after": after,
                    "containment": containment,
                    "limit": limit,
                    "valid_at": valid_at,
                },
            )
            return [memory_from_row(row) for row in await cursor.fetchall()]

    async def delete(
        self, namespace: str, memory_id: uuid.UUID, expected_revision: int | None
    ) -> bool:
        params = {
            "namespace": namespace,
            "memory_id": memory_id,
            "expected": expected_revision,
            "reason": "delete",
        }
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                sql.ERASE.format(
                    victims=sql.BY_ID,
                    extra="AND (%(expected)s::bigint IS NULL OR m.revision = %(expected)s::bigint)"
                    f" AND ({sql.LIVE_M} OR %(expected)s::bigint IS NULL)",
                ),
                params,
            )
            if row is not None:
                return bool(row[0])
            if expected_revision is None:
                return False
            current = await fetch_one(conn, sql.CURRENT_REVISION, params)
        if current is None:
            return False
        raise revision_conflict(current[0], expected_revision)

    async def forget_source(
        self, namespace: str, conversation_id: uuid.UUID, low: int, high: int, incarnation: int = 0
    ) -> int:
        async with self.db.connection() as conn, conn.transaction():
            if incarnation:
                await conn.execute(sql.LOCK_CONVERSATION, (namespace, str(conversation_id)))
                await conn.execute(
                    """INSERT INTO memory.erasures (namespace, conversation_id, incarnation)
                       VALUES (%s, %s, %s) ON CONFLICT DO NOTHING""",
                    (namespace, conversation_id, incarnation),
                )
            cursor = await conn.execute(
                sql.ERASE.format(victims=sql.BY_SOURCE, extra=""),
                {
                    "namespace": namespace,
                    "containment": Jsonb([{"c": str(conversation_id)}]),
                    "conversation": str(conversation_id),
                    "low": low,
                    "high": high,
                    "reason": "forget_source",
                },
            )
            return len(await cursor.fetchall())

    async def sweep_requests(self, older_than_s: float) -> int:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                "DELETE FROM memory.requests WHERE recorded_at < now() - make_interval(secs => %s)",
                (older_than_s,),
            )
            await conn.execute(
                "DELETE FROM memory.erasures WHERE erase_time < now() - make_interval(secs => %s)",
                (ERASURE_RETENTION_S,),
            )
            return cursor.rowcount

    async def sweep_expired(self, limit: int) -> int:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.ERASE.format(victims=sql.EXPIRED, extra=""),
                {"limit": limit, "reason": "expired"},
            )
            return len(await cursor.fetchall())

    async def text_search(
        self,
        namespace: str,
        query: str,
        metadata: Mapping[str, str],
        limit: int,
        valid_at: datetime | None = None,
    ) -> list[ScoredMemory]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.TEXT_SEARCH,
                {
                    "namespace": namespace,
                    "query": query,
                    "metadata": Jsonb(dict(metadata)),
                    "limit": limit,
                    "valid_at": valid_at,
                },
            )
            return [
                ScoredMemory(memory_from_row(row), float(row[COLUMN_COUNT]))
                for row in await cursor.fetchall()
            ]

    async def history(
        self,
        namespace: str,
        memory_id: uuid.UUID,
        after_revision: int = 0,
        limit: int | None = None,
    ) -> list[RevisionRecord]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                """SELECT revision, kind, reason, recorded_at, content, metadata, sources,
                          expire_time, valid_from_time, valid_until_time, superseded_by
                     FROM memory.revisions
                    WHERE namespace = %s AND memory_id = %s AND revision > %s
                    ORDER BY revision
                    LIMIT %s""",
                (namespace, memory_id, after_revision, limit),
            )
            return [
                RevisionRecord(
                    revision=row[0],
                    kind=row[1],
                    reason=row[2],
                    recorded_at=row[3],
                    content=row[4],
                    metadata=row[5] or {},
                    sources=sources_from_json(row[6]),
                    expire_time=row[7],
                    valid_from_time=row[8],
                    valid_until_time=row[9],
                    superseded_by=row[10],
                )
                for row in await cursor.fetchall()
            ]

    async def memory_count(self) -> int:
        """Live memories (tests, reindex)."""
        async with self.db.connection() as conn:
            row = await fetch_one(conn, f"SELECT count(*) FROM memory.memories WHERE {sql.LIVE}")
        return int(row[0]) if row else 0
