"""Memory persistence: the store protocol and its PostgreSQL adapter (schema `memory`).

Every write is ONE SQL statement in autocommit: the change to the memory row,
its history row and its outbox row are written together or not at all, so
the index can never miss a write (transactional outbox). Only when the
statement wrote nothing do we look at why.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from psycopg.types.json import Jsonb

from services.common.db import AsyncConn, Database, fetch_one
from services.memory.index import Key
from services.memory.model import (
    Backlog,
    Memory,
    MemorySource,
    MemoryWrite,
    OutboxEntry,
    RevisionRecord,
    ScoredMemory,
    memory_exists,
    memory_not_found,
    request_id_reused,
    revision_conflict,
    source_not_found,
)

# Erasure tombstones are kept this long: far longer than a source check and its write
# can be apart (a request's deadline is minutes at most).
ERASURE_RETENTION_S = 7 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class OutboxClaim:
    """A batch of outbox rows claimed by one indexer under `token` until its lease ends.

    `current` and `deleted` are the state of the memories the batch names, read
    after the claim in one snapshot: each is at least as new as the writes that
    queued the rows.
    """

    token: uuid.UUID
    entries: Sequence[OutboxEntry]
    # Live memories.
    current: Mapping[Key, Memory]
    # Memories gone (deleted, expired): the revision of their deletion.
    deleted: Mapping[Key, int]

    @property
    def seqs(self) -> list[int]:
        """The outbox rows of the batch."""
        return [e.seq for e in self.entries]


class MemoryStore(Protocol):
    """What the memory service needs from a store. Every method is atomic."""

    async def create(self, write: MemoryWrite) -> tuple[Memory, bool]:
        """Insert a memory; MEMORY_ALREADY_EXISTS if its id is live in the namespace.

        Every write (create and update) is refused with SOURCE_NOT_FOUND when one of
        `write.source_incarnations` was fenced by an erasure, and with a request id
        it replays the request's first result (REQUEST_ID_REUSED for another
        payload). Returns the memory and whether the (first) write created it."""

    async def update(self, write: MemoryWrite) -> tuple[Memory, bool]:
        """Replace a live memory at `write.expected_revision`; NOT_FOUND or REVISION_CONFLICT
        (and the rules of `create` on fences and request ids)."""

    async def get(self, namespace: str, memory_id: uuid.UUID) -> Memory | None:
        """The live memory, or None (also when expired or in another namespace)."""

    async def get_many(
        self, namespace: str, memory_ids: Sequence[uuid.UUID], metadata: Mapping[str, str]
    ) -> list[Memory]:
        """The live memories among `memory_ids` whose metadata holds every pair given."""

    async def list_memories(
        self,
        namespace: str,
        conversation_id: uuid.UUID | None,
        after: uuid.UUID | None,
        limit: int,
    ) -> list[Memory]:
        """Live memories in id order after a cursor, optionally with a source in a conversation."""

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
        self, namespace: str, query: str, metadata: Mapping[str, str], limit: int
    ) -> list[ScoredMemory]:
        """Full-text search over live memories (the degraded mode); rank as score."""

    async def history(self, namespace: str, memory_id: uuid.UUID) -> list[RevisionRecord]:
        """Every revision of a memory id in the namespace, oldest first."""

    async def claim_outbox(self, limit: int, lease_s: float) -> OutboxClaim | None:
        """Claim up to `limit` of the oldest outbox rows that no live claim holds, under
        a new token for `lease_s` seconds; None when there are none. An expired claim
        is claimable again. No transaction stays open: the claim is on the rows."""

    async def complete_outbox(
        self, claim: OutboxClaim, reembedded: Sequence[Key], model: str, dimension: int
    ) -> int:
        """Remove the batch's rows that still carry its token (the others were claimed
        again after the lease ended); record `model` on re-embedded memories. Returns
        how many rows were removed."""

    async def release_outbox(self, claim: OutboxClaim) -> None:
        """Give the batch's rows that still carry its token back to the next claim."""

    async def backlog(self) -> Backlog:
        """Outbox depth and oldest age."""

    async def scan(self, after: Key | None, limit: int) -> list[Memory]:
        """Live memories of every namespace in key order (reindex)."""

    async def set_embedding(self, keys: Sequence[Key], model: str, dimension: int) -> None:
        """Record the model that indexed these memories."""


# --- PostgreSQL -------------------------------------------------------------

_COLUMNS = (
    "namespace, memory_id, content, sources, metadata, revision, create_time, update_time, "
    "expire_time, embedding_model, embedding_dimension"
)
_LIVE = "(expire_time IS NULL OR expire_time > now())"
# The same, on the memories table aliased `m`.
_LIVE_M = "(m.expire_time IS NULL OR m.expire_time > now())"

# The live revision of one memory: why a conditional write wrote nothing.
_CURRENT_REVISION = f"""
SELECT revision FROM memory.memories
 WHERE namespace = %(namespace)s AND memory_id = %(memory_id)s AND {_LIVE}
"""


def _write(change: str, reason: str) -> str:
    """One write statement: `change` (a data-modifying query returning the memory's
    columns) as `m`, then its history row and its outbox row; returns the memory."""
    return f"""
WITH m AS ({change}
), r AS (
    INSERT INTO memory.revisions
           (namespace, memory_id, revision, kind, reason, content, sources, metadata,
            expire_time, recorded_at)
    SELECT namespace, memory_id, revision, 'write', '{reason}', content, sources, metadata,
           expire_time, update_time
      FROM m
), o AS (
    INSERT INTO memory.outbox (namespace, memory_id) SELECT namespace, memory_id FROM m
)
SELECT {_COLUMNS} FROM m
"""


# Create: the revision continues after any earlier incarnation's tombstone.
_CREATE = _write(
    f"""
    INSERT INTO memory.memories
           (namespace, memory_id, content, sources, metadata, revision, expire_time,
            embedding_model, embedding_dimension)
    VALUES (%(namespace)s, %(memory_id)s, %(content)s, %(sources)s, %(metadata)s,
            coalesce((SELECT max(revision) FROM memory.revisions
                       WHERE namespace = %(namespace)s AND memory_id = %(memory_id)s), 0) + 1,
            %(expire_time)s, %(model)s, %(dimension)s)
    ON CONFLICT (namespace, memory_id) DO NOTHING
    RETURNING {_COLUMNS}""",
    "create",
)

# Update: a compare-and-swap on the live memory's revision.
_UPDATE = _write(
    f"""
    UPDATE memory.memories
       SET content = %(content)s, sources = %(sources)s, metadata = %(metadata)s,
           expire_time = %(expire_time)s, embedding_model = %(model)s,
           embedding_dimension = %(dimension)s, revision = revision + 1, update_time = now()
     WHERE namespace = %(namespace)s AND memory_id = %(memory_id)s
       AND revision = %(expected_revision)s AND {_LIVE}
 RETURNING {_COLUMNS}""",
    "update",
)

# Erase the memories that `{victims}` selects (a query returning namespace,
# memory_id): delete the row, blank the content of its whole history, write a
# tombstone and an outbox row, in one statement. Returns one row per memory
# erased, with whether it was still live (not yet expired).
_ERASE = f"""
WITH d AS (
    DELETE FROM memory.memories AS m
     USING ({{victims}}) AS v
     WHERE m.namespace = v.namespace AND m.memory_id = v.memory_id {{extra}}
 RETURNING m.namespace, m.memory_id, m.revision, {_LIVE_M} AS live
), p AS (
    UPDATE memory.revisions AS h
       SET content = NULL, sources = NULL, metadata = NULL
      FROM d
     WHERE h.namespace = d.namespace AND h.memory_id = d.memory_id AND h.content IS NOT NULL
), t AS (
    INSERT INTO memory.revisions (namespace, memory_id, revision, kind, reason)
    SELECT namespace, memory_id, revision + 1, 'delete', %(reason)s FROM d
), o AS (
    INSERT INTO memory.outbox (namespace, memory_id) SELECT namespace, memory_id FROM d
)
SELECT live FROM d
"""

_BY_ID = "SELECT %(namespace)s::text AS namespace, %(memory_id)s::uuid AS memory_id"

_BY_SOURCE = """
SELECT namespace, memory_id FROM memory.memories
 WHERE namespace = %(namespace)s
   AND sources @> %(containment)s
   AND EXISTS (SELECT 1 FROM jsonb_array_elements(sources) AS s
                WHERE s->>'c' = %(conversation)s
                  AND (s->>'f')::bigint <= %(high)s AND (s->>'t')::bigint >= %(low)s)
"""

_EXPIRED = """
SELECT namespace, memory_id FROM memory.memories
 WHERE expire_time IS NOT NULL AND expire_time <= now()
 ORDER BY expire_time
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED
"""

# Degraded search: any query word may match (plainto_tsquery ANDs them, which
# finds almost nothing for a question); ts_rank orders the hits.
_TEXT_SEARCH = f"""
SELECT {_COLUMNS}, ts_rank(content_tsv, q.query) AS score
  FROM memory.memories,
       (SELECT replace(plainto_tsquery('english', %(query)s)::text, ' & ', ' | ')::tsquery
               AS query) AS q
 WHERE namespace = %(namespace)s AND {_LIVE} AND metadata @> %(metadata)s
   AND content_tsv @@ q.query
 ORDER BY score DESC, memory_id
 LIMIT %(limit)s
"""

# Claim the oldest rows no live claim holds: the rows themselves carry the
# claim (token, expiry), so no transaction stays open while the indexer embeds
# and writes the index, and several indexers take disjoint batches. The scan
# follows the primary key and passes over at most the rows of live claims
# (indexers x batch); FOR UPDATE SKIP LOCKED keeps two claims from racing for
# one row.
_CLAIM_OUTBOX = """
WITH c AS (
    SELECT seq FROM memory.outbox
     WHERE claim_until IS NULL OR claim_until < now()
     ORDER BY seq
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE memory.outbox AS o
   SET claim_token = %(token)s, claim_until = now() + make_interval(secs => %(lease_s)s)
  FROM c
 WHERE o.seq = c.seq
RETURNING o.seq, o.namespace, o.memory_id
"""

# The state of the claimed memories in one snapshot: the live row, else the
# last revision recorded (a deletion's tombstone, or the write of a memory
# that expired and awaits the sweeper). Read apart, a re-create between the
# two reads would pass as the revision of a deletion.
_OUTBOX_STATE = f"""
SELECT k.namespace, k.memory_id,
       (SELECT max(r.revision) FROM memory.revisions AS r
         WHERE r.namespace = k.namespace AND r.memory_id = k.memory_id),
       {", ".join("m." + c.strip() for c in _COLUMNS.split(","))}
  FROM unnest(%s::text[], %s::uuid[]) AS k(namespace, memory_id)
  LEFT JOIN memory.memories AS m
    ON m.namespace = k.namespace AND m.memory_id = k.memory_id AND {_LIVE_M}
"""

_COMPLETE_OUTBOX = """
DELETE FROM memory.outbox WHERE seq = ANY(%(seqs)s) AND claim_token = %(token)s
"""

_RELEASE_OUTBOX = """
UPDATE memory.outbox SET claim_token = NULL, claim_until = NULL
 WHERE seq = ANY(%(seqs)s) AND claim_token = %(token)s
"""


# Writes and erasures naming one conversation, one at a time (the same key as the
# summary service's, in its own database or schema).
_LOCK_CONVERSATION = "SELECT pg_advisory_xact_lock(hashtextextended(%s || '/' || %s, 0))"


async def _fence(conn: AsyncConn, write: MemoryWrite) -> tuple[Memory, bool] | None:
    """Inside the write's transaction: lock its source conversations (in a fixed order),
    refuse the write if an erasure fenced one of them, and claim its request id (or return
    the first result of that request). Runs before the write statement, whose snapshot
    then sees every erasure that took the lock first."""
    for cid in sorted(write.source_incarnations):
        await conn.execute(_LOCK_CONVERSATION, (write.namespace, str(cid)))
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
    return await _replayed(conn, write.namespace, memory_id, revision), bool(created)


async def _recorded(
    conn: AsyncConn, write: MemoryWrite, memory: Memory, *, created: bool
) -> tuple[Memory, bool]:
    """Record the write's result under its request id (claimed by `_fence`)."""
    if write.request_id is not None:
        await conn.execute(
            """UPDATE memory.requests SET memory_id = %s, revision = %s, created = %s
                WHERE namespace = %s AND request_id = %s""",
            (memory.memory_id, memory.revision, created, write.namespace, write.request_id),
        )
    return memory, created


async def _replayed(conn: AsyncConn, namespace: str, memory_id: uuid.UUID, revision: int) -> Memory:
    """The memory as a recorded request wrote it: the live memory when it is still at that
    revision, else that revision from the history; MEMORY_NOT_FOUND once deleted (its
    history keeps no content)."""
    row = await fetch_one(
        conn,
        f"""SELECT {_COLUMNS} FROM memory.memories
             WHERE namespace = %s AND memory_id = %s AND revision = %s AND {_LIVE}""",
        (namespace, memory_id, revision),
    )
    if row is not None:
        return _memory(row)
    old = await fetch_one(
        conn,
        """SELECT h.content, h.sources, h.metadata, h.expire_time, h.recorded_at,
                  m.embedding_model, m.embedding_dimension
             FROM memory.revisions AS h
             LEFT JOIN memory.memories AS m USING (namespace, memory_id)
            WHERE h.namespace = %s AND h.memory_id = %s AND h.revision = %s
              AND h.content IS NOT NULL""",
        (namespace, memory_id, revision),
    )
    if old is None:
        raise memory_not_found()
    content, sources, metadata, expire_time, recorded_at, model, dimension = old
    return _memory(
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
        )
    )


def sources_json(sources: Sequence[MemorySource]) -> list[dict[str, object]]:
    """The stored form of sources (short keys: it is repeated in every history row)."""
    return [
        {"c": str(s.conversation_id), "f": s.from_sequence, "t": s.through_sequence}
        for s in sources
    ]


def _memory(row: Sequence[Any]) -> Memory:
    (
        namespace,
        memory_id,
        content,
        sources,
        metadata,
        revision,
        create_time,
        update_time,
        expire_time,
        model,
        dimension,
    ) = row[:11]
    return Memory(
        namespace=namespace,
        memory_id=memory_id,
        content=content,
        sources=tuple(MemorySource(uuid.UUID(s["c"]), s["f"], s["t"]) for s in sources),
        metadata=metadata or {},
        revision=revision,
        create_time=create_time,
        update_time=update_time,
        expire_time=expire_time,
        embedding_model=model,
        embedding_dimension=dimension,
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
    }


async def _set_embedding(conn: AsyncConn, keys: Sequence[Key], model: str, dimension: int) -> None:
    if not keys:
        return
    await conn.execute(
        """UPDATE memory.memories AS m SET embedding_model = %s, embedding_dimension = %s
             FROM unnest(%s::text[], %s::uuid[]) AS k(namespace, memory_id)
            WHERE m.namespace = k.namespace AND m.memory_id = k.memory_id
              AND (m.embedding_model <> %s OR m.embedding_dimension <> %s)""",
        (model, dimension, [k[0] for k in keys], [k[1] for k in keys], model, dimension),
    )


class PostgresMemoryStore:
    """MemoryStore on PostgreSQL (schema `memory`)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def create(self, write: MemoryWrite) -> tuple[Memory, bool]:
        params = _write_params(write)
        async with self.db.connection() as conn, conn.transaction():
            replayed = await _fence(conn, write)
            if replayed is not None:
                return replayed
            for _ in range(2):
                row = await fetch_one(conn, _CREATE, params)
                if row is not None:
                    return await _recorded(conn, write, _memory(row), created=True)
                # The id is taken. A lapsed memory the sweeper has not reached
                # yet is gone for every reader: erase it, then create again.
                erased = await fetch_one(
                    conn,
                    _ERASE.format(victims=_BY_ID, extra=f"AND NOT {_LIVE}"),
                    {**params, "reason": "expired"},
                )
                if erased is None:
                    break
        raise memory_exists()

    async def update(self, write: MemoryWrite) -> tuple[Memory, bool]:
        params = _write_params(write)
        async with self.db.connection() as conn, conn.transaction():
            replayed = await _fence(conn, write)
            if replayed is not None:
                return replayed
            row = await fetch_one(conn, _UPDATE, params)
            if row is not None:
                return await _recorded(conn, write, _memory(row), created=False)
            current = await fetch_one(conn, _CURRENT_REVISION, params)
        if current is None:
            raise memory_not_found()
        assert write.expected_revision is not None
        raise revision_conflict(current[0], write.expected_revision)

    async def get(self, namespace: str, memory_id: uuid.UUID) -> Memory | None:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                f"""SELECT {_COLUMNS} FROM memory.memories
                     WHERE namespace = %s AND memory_id = %s AND {_LIVE}""",
                (namespace, memory_id),
            )
        return _memory(row) if row else None

    async def get_many(
        self, namespace: str, memory_ids: Sequence[uuid.UUID], metadata: Mapping[str, str]
    ) -> list[Memory]:
        if not memory_ids:
            return []
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                f"""SELECT {_COLUMNS} FROM memory.memories
                     WHERE namespace = %s AND memory_id = ANY(%s) AND {_LIVE}
                       AND metadata @> %s""",
                (namespace, list(memory_ids), Jsonb(dict(metadata))),
            )
            return [_memory(row) for row in await cursor.fetchall()]

    async def list_memories(
        self,
        namespace: str,
        conversation_id: uuid.UUID | None,
        after: uuid.UUID | None,
        limit: int,
    ) -> list[Memory]:
        containment = Jsonb([{"c": str(conversation_id)}]) if conversation_id else None
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                f"""SELECT {_COLUMNS} FROM memory.memories
                     WHERE namespace = %(namespace)s AND {_LIVE}
                       AND (%(after)s::uuid IS NULL OR memory_id > %(after)s::uuid)
                       AND (%(containment)s::jsonb IS NULL OR sources @> %(containment)s::jsonb)
                     ORDER BY memory_id
                     LIMIT %(limit)s""",
                {
                    "namespace": namespace,
                    "after": after,
                    "containment": containment,
                    "limit": limit,
                },
            )
            return [_memory(row) for row in await cursor.fetchall()]

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
                _ERASE.format(
                    victims=_BY_ID,
                    extra="AND (%(expected)s::bigint IS NULL OR m.revision = %(expected)s::bigint)"
                    f" AND ({_LIVE_M} OR %(expected)s::bigint IS NULL)",
                ),
                params,
            )
            if row is not None:
                return bool(row[0])
            if expected_revision is None:
                return False
            current = await fetch_one(conn, _CURRENT_REVISION, params)
        if current is None:
            return False
        raise revision_conflict(current[0], expected_revision)

    async def forget_source(
        self, namespace: str, conversation_id: uuid.UUID, low: int, high: int, incarnation: int = 0
    ) -> int:
        async with self.db.connection() as conn, conn.transaction():
            if incarnation:
                await conn.execute(_LOCK_CONVERSATION, (namespace, str(conversation_id)))
                await conn.execute(
                    """INSERT INTO memory.erasures (namespace, conversation_id, incarnation)
                       VALUES (%s, %s, %s) ON CONFLICT DO NOTHING""",
                    (namespace, conversation_id, incarnation),
                )
            cursor = await conn.execute(
                _ERASE.format(victims=_BY_SOURCE, extra=""),
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
                _ERASE.format(victims=_EXPIRED, extra=""), {"limit": limit, "reason": "expired"}
            )
            return len(await cursor.fetchall())

    async def text_search(
        self, namespace: str, query: str, metadata: Mapping[str, str], limit: int
    ) -> list[ScoredMemory]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                _TEXT_SEARCH,
                {
                    "namespace": namespace,
                    "query": query,
                    "metadata": Jsonb(dict(metadata)),
                    "limit": limit,
                },
            )
            return [ScoredMemory(_memory(row), float(row[11])) for row in await cursor.fetchall()]

    async def history(self, namespace: str, memory_id: uuid.UUID) -> list[RevisionRecord]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                """SELECT revision, kind, reason, recorded_at, content, metadata
                     FROM memory.revisions WHERE namespace = %s AND memory_id = %s
                    ORDER BY revision""",
                (namespace, memory_id),
            )
            return [
                RevisionRecord(row[0], row[1], row[2], row[3], row[4], row[5] or {})
                for row in await cursor.fetchall()
            ]

    async def claim_outbox(self, limit: int, lease_s: float) -> OutboxClaim | None:
        token = uuid.uuid4()
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                _CLAIM_OUTBOX, {"limit": limit, "lease_s": lease_s, "token": token}
            )
            entries = sorted(
                (OutboxEntry(*row) for row in await cursor.fetchall()), key=lambda e: e.seq
            )
            if not entries:
                return None
            keys = list(dict.fromkeys((e.namespace, e.memory_id) for e in entries))
            cursor = await conn.execute(_OUTBOX_STATE, ([k[0] for k in keys], [k[1] for k in keys]))
            current: dict[Key, Memory] = {}
            deleted: dict[Key, int] = {}
            for row in await cursor.fetchall():
                namespace, memory_id, last_revision = row[:3]
                if row[3] is None:  # no live row joined
                    deleted[(namespace, memory_id)] = last_revision or 0
                else:
                    current[(namespace, memory_id)] = _memory(row[3:])
        return OutboxClaim(token, entries, current, deleted)

    async def complete_outbox(
        self, claim: OutboxClaim, reembedded: Sequence[Key], model: str, dimension: int
    ) -> int:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                _COMPLETE_OUTBOX, {"seqs": claim.seqs, "token": claim.token}
            )
            await _set_embedding(conn, reembedded, model, dimension)
            return cursor.rowcount

    async def release_outbox(self, claim: OutboxClaim) -> None:
        async with self.db.connection() as conn:
            await conn.execute(_RELEASE_OUTBOX, {"seqs": claim.seqs, "token": claim.token})

    async def backlog(self) -> Backlog:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                """SELECT count(*), coalesce(extract(epoch FROM now() - min(enqueued_at)), 0)
                     FROM memory.outbox""",
            )
        assert row is not None
        return Backlog(int(row[0]), float(row[1]))

    async def scan(self, after: Key | None, limit: int) -> list[Memory]:
        namespace, memory_id = after if after else ("", uuid.UUID(int=0))
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                f"""SELECT {_COLUMNS} FROM memory.memories
                     WHERE (namespace, memory_id) > (%s, %s) AND {_LIVE}
                     ORDER BY namespace, memory_id LIMIT %s""",
                (namespace, memory_id, limit),
            )
            return [_memory(row) for row in await cursor.fetchall()]

    async def set_embedding(self, keys: Sequence[Key], model: str, dimension: int) -> None:
        async with self.db.connection() as conn:
            await _set_embedding(conn, keys, model, dimension)

    async def memory_count(self) -> int:
        """Live memories (tests, reindex)."""
        async with self.db.connection() as conn:
            row = await fetch_one(conn, f"SELECT count(*) FROM memory.memories WHERE {_LIVE}")
        return int(row[0]) if row else 0
