"""The steps of a memory write's transaction around its write statement (store.py's writes).

Before the statement: `check_sources_and_claim` locks the source conversations, refuses a write an
erasure fenced, and claims the request id (or replays the request's first result);
`lock_superseded` locks the memories the write supersedes. After it: `recorded`
closes their validity (each checked first) and records the result under the
request id. Any refusal raises, and the whole transaction rolls back.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from services.common.postgres.pool import AsyncConn, fetch_one
from services.memory.model import Memory, memory_not_found
from services.memory.rows import memory_from_row
from services.memory.writes import statements as sql
from services.memory.writes.model import (
    MemoryWrite,
    WriteResult,
    request_id_reused,
    source_not_found,
    superseded_conflict,
    superseded_not_found,
    supersedes_later_fact,
    supersession_cycle,
    validity_ended,
)


async def check_sources_and_claim(conn: AsyncConn, write: MemoryWrite) -> WriteResult | None:
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


async def recorded(
    conn: AsyncConn,
    write: MemoryWrite,
    memory: Memory,
    locked: Mapping[uuid.UUID, Sequence[Any]],
    *,
    created: bool,
) -> WriteResult:
    """Supersede what the write names (rows locked by `lock_superseded`), and record the
    write's result under its request id (claimed by `check_sources_and_claim`)."""
    superseded = await _supersede(conn, write, memory, locked)
    if write.request_id is not None:
        await conn.execute(
            """UPDATE memory.requests SET memory_id = %s, revision = %s, created = %s
                WHERE namespace = %s AND request_id = %s""",
            (memory.memory_id, memory.revision, created, write.namespace, write.request_id),
        )
    return WriteResult(memory, created, superseded)


async def lock_superseded(
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
        sql.LIVE_AT_REVISION,
        (namespace, memory_id, revision),
    )
    if row is not None:
        return memory_from_row(row)
    # The history row in the order of COLUMNS (statements.py; its record time stands for
    # both the create and the update time; the model is the memory's, gone once deleted).
    old = await fetch_one(
        conn,
        """SELECT h.namespace, h.memory_id, h.content, h.sources, h.metadata, h.revision,
                  h.recorded_at, h.recorded_at, h.expire_time,
                  coalesce(m.embedding_model, ''), coalesce(m.embedding_dimension, 0),
                  h.valid_from_time, h.valid_until_time, h.superseded_by
             FROM memory.revisions AS h
             LEFT JOIN memory.memories AS m USING (namespace, memory_id)
            WHERE h.namespace = %s AND h.memory_id = %s AND h.revision = %s
              AND h.content IS NOT NULL""",
        (namespace, memory_id, revision),
    )
    if old is None:
        raise memory_not_found()
    return memory_from_row(old)
