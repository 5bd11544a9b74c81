"""The memory writes on PostgreSQL (schema `memory`): the protocol and its adapter, mixed
into PostgresMemoryStore (store.py).

Every write is ONE SQL statement in autocommit: the change to the memory row,
its history row and its outbox row are written together or not at all, so
the index can never miss a write (transactional outbox). Only when the
statement wrote nothing do we look at why. The same statement numbers the
write's changes in its namespace's change feed (WatchMemories): the history row
is the feed's record, and the statement says, after the commit, whether a
process watches the namespace (`ChangeSink`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import psycopg
from psycopg.types.json import Jsonb

from services.common.postgres.pool import AsyncConn, Database, fetch_one
from services.memory.model import Forgotten, MemoryErasure, invalid_validity, memory_not_found
from services.memory.rows import COLUMN_COUNT, memory_from_row, sources_json
from services.memory.statements import LIVE, LIVE_M
from services.memory.writes import statements as sql
from services.memory.writes import transaction
from services.memory.writes.model import MemoryWrite, WriteResult, memory_exists, revision_conflict

# Erasure tombstones are kept this long: far longer than a source check and its write
# can be apart (a request's deadline is minutes at most).
ERASURE_RETENTION_S = 7 * 24 * 3600.0


class ChangeSink(Protocol):
    """Where a store reports the committed writes of watched namespaces (WatchMemories)."""

    def changed(self, key: int) -> None:
        """The namespace of feed key `key` changed (called after the commit; must not
        block)."""


class WriteStore(Protocol):
    """The writes of MemoryStore. Every method is atomic."""

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
        (and the rules of `create` on tombstones, request ids and supersession). Validity not
        given is kept; a validity that would end before it starts is INVALID_VALIDITY."""

    async def delete(
        self, namespace: str, memory_id: uuid.UUID, expected_revision: int | None
    ) -> bool:
        """Erase a memory; False if it was not live; REVISION_CONFLICT on a stale revision."""

    async def forget_source(
        self, namespace: str, conversation_id: uuid.UUID, low: int, high: int, incarnation: int = 0
    ) -> Forgotten:
        """Erase every memory with a source range of the conversation overlapping [low, high];
        with an `incarnation`, leave its tombstone (later writes naming it are refused), which
        adds up what every erasure of the incarnation erased (Forgotten.erasure), and
        delete the conversation's curation jobs and cursor."""

    async def forget_external(self, namespace: str, uri: str) -> int:
        """Erase every memory one of whose sources is the external `uri` (exactly); return
        how many. Nothing is fenced: a later write may name the URI again."""

    async def erasure(
        self, namespace: str, conversation_id: uuid.UUID, incarnation: int
    ) -> MemoryErasure | None:
        """The erasure of that incarnation (None when no tombstone of it is kept), its
        `index_complete_time` recorded once no index write it queued is left in the outbox."""

    async def erased(self, namespace: str, conversation_id: uuid.UUID, incarnation: int) -> bool:
        """Whether an erasure fenced this incarnation of the conversation (within
        ERASURE_RETENTION_S; the transcript of an erased incarnation is gone long before)."""

    async def sweep_requests(self, older_than_s: float) -> int:
        """Forget request ids recorded more than `older_than_s` ago, and erasure tombstones
        older than ERASURE_RETENTION_S whose index writes are all applied."""

    async def sweep_expired(self, limit: int) -> int:
        """Erase up to `limit` expired memories; return how many."""


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


def _watched(rows: Iterable[Sequence[Any]], column: int) -> set[int]:
    """The feed keys to announce that a write statement's rows name (column `column`)."""
    return {row[column] for row in rows if row[column] is not None}


class PostgresWrites:
    """The write methods of PostgresMemoryStore."""

    db: Database
    # Told of each committed change to a watched namespace (WatchMemories).
    changes: ChangeSink | None = None

    def announce(self, keys: Iterable[int]) -> None:
        """Writes to the namespaces of these feed keys committed: wake their streams."""
        if self.changes is not None:
            for key in keys:
                self.changes.changed(key)

    async def create(self, write: MemoryWrite) -> WriteResult:
        params = _write_params(write)
        watched: set[int] = set()
        result: WriteResult | None = None
        async with self.db.connection() as conn, conn.transaction():
            replayed = await transaction.check_sources_and_claim(conn, write)
            if replayed is not None:
                return replayed
            locked = await transaction.lock_superseded(conn, write, updating=False)
            for _ in range(2):
                row = await fetch_one(conn, sql.CREATE, params)
                if row is not None:
                    # Its supersessions are in its namespace: the same feed key.
                    watched |= _watched([row], COLUMN_COUNT)
                    result = await transaction.recorded(
                        conn, write, memory_from_row(row), locked, created=True
                    )
                    break
                # The id is taken. A lapsed memory the sweeper has not reached
                # yet is gone for every reader: erase it, then create again.
                erased = await fetch_one(
                    conn,
                    sql.ERASE.format(victims=sql.BY_ID, extra=f"AND NOT {LIVE}"),
                    {**params, "reason": "expired"},
                )
                if erased is None:
                    break
                watched |= _watched([erased], 1)
        if result is None:
            raise memory_exists()
        self.announce(watched)
        return result

    async def update(self, write: MemoryWrite) -> WriteResult:
        params = _write_params(write)
        result: WriteResult | None = None
        watched: set[int] = set()
        current: Sequence[Any] | None = None
        try:
            async with self.db.connection() as conn, conn.transaction():
                replayed = await transaction.check_sources_and_claim(conn, write)
                if replayed is not None:
                    return replayed
                locked = await transaction.lock_superseded(conn, write, updating=True)
                row = await fetch_one(conn, sql.UPDATE, params)
                if row is not None:
                    result = await transaction.recorded(
                        conn, write, memory_from_row(row), locked, created=False
                    )
                    # Its supersessions are in its namespace: the same feed key.
                    watched = _watched([row], COLUMN_COUNT)
                else:
                    current = await fetch_one(conn, sql.CURRENT_REVISION, params)
        except psycopg.errors.CheckViolation as exc:
            # The validity given, with the one kept, would end before it starts.
            if exc.diag.constraint_name == "memories_validity":
                raise invalid_validity() from None
            raise
        if result is not None:
            self.announce(watched)
            return result
        if current is None:
            raise memory_not_found()
        assert write.expected_revision is not None
        raise revision_conflict(current[0], write.expected_revision)

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
                    f" AND ({LIVE_M} OR %(expected)s::bigint IS NULL)",
                ),
                params,
            )
            if row is not None:
                self.announce(_watched([row], 1))
                return bool(row[0])
            if expected_revision is None:
                return False
            current = await fetch_one(conn, sql.CURRENT_REVISION, params)
        if current is None:
            return False
        raise revision_conflict(current[0], expected_revision)

    async def forget_source(
        self, namespace: str, conversation_id: uuid.UUID, low: int, high: int, incarnation: int = 0
    ) -> Forgotten:
        params = {
            "namespace": namespace,
            "conversation_id": conversation_id,
            "incarnation": incarnation,
        }
        async with self.db.connection() as conn, conn.transaction():
            if incarnation:
                await conn.execute(sql.LOCK_CONVERSATION, (namespace, str(conversation_id)))
                # Its curation jobs (a running one finds its lease gone and stops; its
                # batch in flight is refused by the tombstone) and its cursor.
                await conn.execute(
                    """DELETE FROM memory.curation_jobs
                        WHERE namespace = %s AND conversation_id = %s""",
                    (namespace, conversation_id),
                )
                await conn.execute(
                    """DELETE FROM memory.curation_cursors
                        WHERE namespace = %s AND conversation_id = %s""",
                    (namespace, conversation_id),
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
            rows = await cursor.fetchall()
            erasure = None
            if incarnation:
                # The tombstone, under the lock and in the erasure's transaction: later
                # writes naming the incarnation are refused, and it adds this call's
                # counts up.
                await conn.execute(
                    sql.RECORD_ERASURE,
                    {**params, "memories": len(rows), "revisions": rows[0][2] if rows else 0},
                )
                erasure = await _erasure(conn, params)
        self.announce(_watched(rows, 1))
        return Forgotten(len(rows), erasure)

    async def forget_external(self, namespace: str, uri: str) -> int:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.ERASE.format(victims=sql.BY_EXTERNAL, extra=""),
                {
                    "namespace": namespace,
                    "containment": Jsonb([{"u": uri}]),
                    "reason": "forget_source",
                },
            )
            rows = await cursor.fetchall()
        self.announce(_watched(rows, 1))
        return len(rows)

    async def erasure(
        self, namespace: str, conversation_id: uuid.UUID, incarnation: int
    ) -> MemoryErasure | None:
        params = {
            "namespace": namespace,
            "conversation_id": conversation_id,
            "incarnation": incarnation,
        }
        async with self.db.connection() as conn:
            return await _erasure(conn, params)

    async def erased(self, namespace: str, conversation_id: uuid.UUID, incarnation: int) -> bool:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                """SELECT 1 FROM memory.erasures
                    WHERE namespace = %s AND conversation_id = %s AND incarnation = %s""",
                (namespace, conversation_id, incarnation),
            )
        return row is not None

    async def sweep_requests(self, older_than_s: float) -> int:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                "DELETE FROM memory.requests WHERE recorded_at < now() - make_interval(secs => %s)",
                (older_than_s,),
            )
            await conn.execute(sql.PRUNE_ERASURES, {"retention_s": ERASURE_RETENTION_S})
            return cursor.rowcount

    async def sweep_expired(self, limit: int) -> int:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.ERASE.format(victims=sql.EXPIRED, extra=""),
                {"limit": limit, "reason": "expired"},
            )
            rows = await cursor.fetchall()
        self.announce(_watched(rows, 1))
        return len(rows)


async def _erasure(conn: AsyncConn, params: dict[str, Any]) -> MemoryErasure | None:
    """The erasure of an incarnation, its index completion recorded first if the outbox has
    applied every index write it queued (seen from `conn`'s transaction)."""
    await conn.execute(sql.INDEX_CAUGHT_UP, params)
    row = await fetch_one(conn, sql.ERASURE, params)
    return MemoryErasure(*row) if row is not None else None
