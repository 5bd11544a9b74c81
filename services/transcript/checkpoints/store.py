"""Checkpoints in the store: the protocol (`CheckpointStore`) and its PostgreSQL adapter.

A put is one short transaction: the conversation held against erasure and deletions,
the lease it quotes checked (and held until it commits), the new channel values
inserted (a value stored already is kept: values are stored once per version; one that
mostly repeats the channel's value at the parent checkpoint as a delta of it), the
checkpoint's row upserted, and its size checked (refused as a whole beyond the limit).
Reads cut a page by weight before they read any value.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, Protocol

from services.common.postgres.pool import AsyncConn
from services.transcript.checkpoints import statements as sql
from services.transcript.checkpoints.model import (
    DELTA_MAX_DEPTH,
    DELTA_MIN_BYTES,
    ChannelValue,
    CheckpointDeletion,
    CheckpointPage,
    CheckpointQuery,
    CheckpointWrite,
    DeleteRequest,
    Delta,
    Fence,
    NewCheckpoint,
    NewWrites,
    StoredCheckpoint,
    TypedValue,
    apply_delta,
    checkpoint_too_large,
    delta_of,
)
from services.transcript.conversations.model import conversation_not_found
from services.transcript.conversations.store import PostgresBase
from services.transcript.leases.model import conversation_busy, turn_lease_lost


class CheckpointStore(Protocol):
    """The checkpoints part of TranscriptStore."""

    async def put_checkpoint(self, put: NewCheckpoint) -> int:
        """Store the checkpoint and its new channel values; the number of values stored.
        CONVERSATION_NOT_FOUND, TURN_LEASE_LOST, CONVERSATION_BUSY, CHECKPOINT_TOO_LARGE
        write nothing."""

    async def put_checkpoint_writes(self, put: NewWrites) -> int:
        """Store pending writes; the number stored or replaced."""

    async def get_checkpoint(
        self, namespace: str, conversation_id: uuid.UUID, checkpoint_ns: str, checkpoint_id: str
    ) -> StoredCheckpoint | None:
        """The checkpoint (the newest of `checkpoint_ns` when `checkpoint_id` is empty);
        None when there is none, or no conversation."""

    async def list_checkpoints(self, query: CheckpointQuery) -> CheckpointPage:
        """A page of checkpoints, newest first (empty when the conversation is missing)."""

    async def delete_checkpoints(self, request: DeleteRequest) -> CheckpointDeletion:
        """Delete the runs' or the conversations' checkpoints, their writes and the
        values no checkpoint names any more."""

    async def copy_checkpoints(
        self, namespace: str, source: uuid.UUID, target: uuid.UUID
    ) -> int | None:
        """Copy the source's checkpoints into the target; the number copied, None when
        the source is missing. CONVERSATION_NOT_FOUND for a missing target."""


class PostgresCheckpoints(PostgresBase):
    """CheckpointStore on PostgreSQL (schema `transcript`)."""

    async def put_checkpoint(self, put: NewCheckpoint) -> int:
        channels = list(put.channel_versions)
        versions = [put.channel_versions[channel] for channel in channels]
        async with self.db.connection() as conn, conn.transaction():
            key = await _hold(conn, put.namespace, put.conversation_id, put.fence)
            stored = 0
            if put.channel_values:
                stored = await _put_values(conn, key, put)
            params = {
                "key": key,
                "checkpoint_ns": put.checkpoint_ns,
                "channels": channels,
                "versions": versions,
            }
            cursor = await conn.execute(sql.VALUES_BYTES, params)
            row = await cursor.fetchone()
            weight = (int(row[0]) if row else 0) + len(put.checkpoint.value or b"")
            if weight > put.max_checkpoint_bytes:
                raise checkpoint_too_large(put.max_checkpoint_bytes)
            await conn.execute(
                sql.PUT_CHECKPOINT,
                {
                    **params,
                    "checkpoint_id": put.checkpoint_id,
                    "parent_checkpoint_id": put.parent_checkpoint_id,
                    "checkpoint_type": put.checkpoint.type,
                    "checkpoint": put.checkpoint.value or b"",
                    "metadata": put.metadata_json,
                    "run_id": put.run_id,
                },
            )
        return stored

    async def put_checkpoint_writes(self, put: NewWrites) -> int:
        async with self.db.connection() as conn, conn.transaction():
            key = await _hold(conn, put.namespace, put.conversation_id, put.fence)
            cursor = await conn.execute(
                sql.PUT_WRITES,
                {
                    "key": key,
                    "checkpoint_ns": put.checkpoint_ns,
                    "checkpoint_id": put.checkpoint_id,
                    "task_id": put.task_id,
                    "task_path": put.task_path,
                    "idxs": [w.idx for w in put.writes],
                    "channels": [w.channel for w in put.writes],
                    "types": [w.value.type for w in put.writes],
                    "blobs": [w.value.value or b"" for w in put.writes],
                },
            )
            stored = int(cursor.rowcount)
            cursor = await conn.execute(
                sql.WEIGHT_WITH_WRITES,
                {
                    "key": key,
                    "checkpoint_ns": put.checkpoint_ns,
                    "checkpoint_id": put.checkpoint_id,
                },
            )
            row = await cursor.fetchone()
            if row is not None and int(row[0]) > put.max_checkpoint_bytes:
                raise checkpoint_too_large(put.max_checkpoint_bytes)  # rolled back
            return stored

    async def list_checkpoints(self, query: CheckpointQuery) -> CheckpointPage:
        async with self.db.connection() as conn, conn.transaction():
            await conn.execute(sql.ONE_SNAPSHOT)
            cursor = await conn.execute(
                sql.CONVERSATION_KEY,
                {"namespace": query.namespace, "conversation_id": query.conversation_id},
            )
            found = await cursor.fetchone()
            if found is None:
                return CheckpointPage([], False)
            key = found[0]
            cursor = await conn.execute(
                sql.LIST_KEYS,
                {
                    "key": key,
                    "checkpoint_ns": query.checkpoint_ns,
                    "checkpoint_id": None,
                    "filter": query.filter_json,
                    "before": query.before_checkpoint_id,
                    "after_id": query.after[0] if query.after else None,
                    "after_ns": query.after[1] if query.after else None,
                    "limit": query.limit + 1,
                },
            )
            rows = await cursor.fetchall()
            chosen: list[tuple[str, str]] = []
            weight = 0
            for checkpoint_ns, checkpoint_id, size in rows[: query.limit]:
                # Never an empty page: the first checkpoint goes in whatever it weighs
                # (a put refuses one heavier than the limit).
                if chosen and weight + int(size) > query.max_bytes:
                    break
                chosen.append((checkpoint_ns, checkpoint_id))
                weight += int(size)
            more = len(rows) > len(chosen)
            return CheckpointPage(await _read(conn, key, chosen), more)

    async def get_checkpoint(
        self, namespace: str, conversation_id: uuid.UUID, checkpoint_ns: str, checkpoint_id: str
    ) -> StoredCheckpoint | None:
        """The checkpoint (the newest of `checkpoint_ns` when `checkpoint_id` is empty)."""
        async with self.db.connection() as conn, conn.transaction():
            await conn.execute(sql.ONE_SNAPSHOT)
            cursor = await conn.execute(
                sql.CONVERSATION_KEY, {"namespace": namespace, "conversation_id": conversation_id}
            )
            found = await cursor.fetchone()
            if found is None:
                return None
            key = found[0]
            cursor = await conn.execute(
                sql.LIST_KEYS,
                {
                    "key": key,
                    "checkpoint_ns": checkpoint_ns,
                    "checkpoint_id": checkpoint_id or None,
                    "filter": None,
                    "before": None,
                    "after_id": None,
                    "after_ns": None,
                    "limit": 1,
                },
            )
            row = await cursor.fetchone()
            if row is None:
                return None
            read = await _read(conn, key, [(row[0], row[1])])
            return read[0] if read else None

    async def delete_checkpoints(self, request: DeleteRequest) -> CheckpointDeletion:
        async with self.db.connection() as conn, conn.transaction():
            if request.run_ids:
                cursor = await conn.execute(
                    sql.LOCK_BY_RUNS,
                    {"namespace": request.namespace, "run_ids": list(request.run_ids)},
                )
                keys = [row[0] for row in await cursor.fetchall()]
                if not keys:
                    return CheckpointDeletion()
                cursor = await conn.execute(
                    sql.DELETE_RUNS, {"keys": keys, "run_ids": list(request.run_ids)}
                )
            else:
                cursor = await conn.execute(
                    sql.LOCK_BY_IDS,
                    {
                        "namespace": request.namespace,
                        "conversation_ids": list(request.conversation_ids),
                    },
                )
                keys = [row[0] for row in await cursor.fetchall()]
                if not keys:
                    return CheckpointDeletion()
                cursor = await conn.execute(
                    sql.DELETE_OF_CONVERSATIONS,
                    {"keys": keys, "keep_latest": request.keep_latest},
                )
            checkpoints = cursor.rowcount
            cursor = await conn.execute(sql.DELETE_ORPHAN_WRITES, {"keys": keys})
            writes = cursor.rowcount
            values = 0
            while True:
                # A pass leaves the bases of the deltas it deletes: the next takes them.
                cursor = await conn.execute(sql.DELETE_ORPHAN_VALUES, {"keys": keys})
                if not cursor.rowcount:
                    break
                values += cursor.rowcount
            return CheckpointDeletion(checkpoints, values, writes)

    async def copy_checkpoints(
        self, namespace: str, source: uuid.UUID, target: uuid.UUID
    ) -> int | None:
        async with self.db.connection() as conn, conn.transaction():
            cursor = await conn.execute(
                sql.LOCK_PAIR, {"namespace": namespace, "source": source, "target": target}
            )
            keys = {row[0]: row[1] for row in await cursor.fetchall()}
            if source not in keys:
                return None
            if target not in keys:
                raise conversation_not_found()
            params = {"source": keys[source], "target": keys[target]}
            # Checkpoints first: each statement reads what was committed when it began
            # (READ COMMITTED), and a put commits its values with its checkpoint, so the
            # values read after the checkpoints include every copied checkpoint's.
            cursor = await conn.execute(sql.COPY_CHECKPOINTS, params)
            copied = cursor.rowcount
            await conn.execute(sql.COPY_VALUES, params)
            await conn.execute(sql.COPY_WRITES, params)
            return int(copied)


async def _hold(
    conn: AsyncConn, namespace: str, conversation_id: uuid.UUID, fence: Fence | None
) -> int:
    """The key of the conversation a put writes to, held until the put commits; with a
    fence, the lease it quotes held too (TURN_LEASE_LOST when it does not hold), without,
    CONVERSATION_BUSY while another turn holds the conversation exclusively."""
    cursor = await conn.execute(
        sql.THREAD, {"namespace": namespace, "conversation_id": conversation_id}
    )
    row = await cursor.fetchone()
    if row is None:
        raise conversation_not_found()
    key, holder, lease_live, _ = row
    if fence is not None:
        cursor = await conn.execute(
            sql.LEASE_HELD,
            {"key": key, "turn_id": fence.turn_id, "fencing_token": fence.fencing_token},
        )
        if await cursor.fetchone() is None:
            raise turn_lease_lost()
    elif lease_live and holder is not None:
        raise conversation_busy(holder)
    return int(key)


async def _put_values(conn: AsyncConn, key: int, put: NewCheckpoint) -> int:
    """Insert the values not stored yet: each whole, or as a delta of the channel's value
    at the parent checkpoint when it mostly repeats it (model.py); the number stored."""
    where = {"key": key, "checkpoint_ns": put.checkpoint_ns}
    cursor = await conn.execute(
        sql.STORED_VERSIONS,
        {
            **where,
            "channels": [v.channel for v in put.channel_values],
            "versions": [v.version for v in put.channel_values],
        },
    )
    existing = {(row[0], row[1]) for row in await cursor.fetchall()}
    fresh = [v for v in put.channel_values if (v.channel, v.version) not in existing]
    if not fresh:
        return 0
    parents: dict[str, str] = {}
    if put.parent_checkpoint_id and any(
        len(v.value.value or b"") >= DELTA_MIN_BYTES for v in fresh
    ):
        cursor = await conn.execute(
            sql.PARENT_VERSIONS, {**where, "parent": put.parent_checkpoint_id}
        )
        row = await cursor.fetchone()
        if row is not None:
            parents = dict(zip(row[0], row[1], strict=True))
    columns: dict[str, list[Any]] = {
        name: []
        for name in (
            "channels",
            "versions",
            "types",
            "blobs",
            "full_lengths",
            "base_versions",
            "head_lengths",
            "base_offsets",
            "base_lengths",
            "depths",
        )
    }
    for value in fresh:
        data = value.value.value or b""
        base_version = parents.get(value.channel)
        delta, depth = None, 0
        if (
            base_version is not None
            and base_version != value.version
            and len(data) >= DELTA_MIN_BYTES
        ):
            base = await _resolve(conn, key, put.checkpoint_ns, value.channel, base_version)
            if base is not None and base[1] < DELTA_MAX_DEPTH:
                delta, depth = delta_of(data, base[0].value or b""), base[1] + 1
        columns["channels"].append(value.channel)
        columns["versions"].append(value.version)
        columns["types"].append(value.value.type)
        columns["blobs"].append(delta.blob if delta else data)
        columns["full_lengths"].append(len(data))
        columns["base_versions"].append(base_version if delta else None)
        columns["head_lengths"].append(delta.head_length if delta else None)
        columns["base_offsets"].append(delta.base_offset if delta else None)
        columns["base_lengths"].append(delta.base_length if delta else None)
        columns["depths"].append(depth if delta else 0)
    cursor = await conn.execute(sql.PUT_VALUES, {**where, **columns})
    return int(cursor.rowcount)


async def _resolve(
    conn: AsyncConn, key: int, checkpoint_ns: str, channel: str, version: str
) -> tuple[TypedValue, int] | None:
    """A stored value, whole (its delta chain applied), and its depth; None when it is
    not stored."""
    cursor = await conn.execute(
        sql.CHAIN,
        {"key": key, "checkpoint_ns": checkpoint_ns, "channel": channel, "version": version},
    )
    chain = await cursor.fetchall()
    if not chain:
        return None
    if chain[-1][2] is not None:
        # A base is missing: deletions keep every base a stored delta needs.
        raise RuntimeError("a checkpoint value's delta chain is broken")
    data = bytes(chain[-1][1]) if chain[-1][1] is not None else b""
    for _, blob, _, head_length, base_offset, base_length, _ in reversed(chain[:-1]):
        data = apply_delta(Delta(bytes(blob), head_length, base_offset, base_length), data)
    return TypedValue(chain[0][0], data), int(chain[0][6])


async def _read(
    conn: AsyncConn, key: int, chosen: Sequence[tuple[str, str]]
) -> list[StoredCheckpoint]:
    """The chosen checkpoints, in the order given, with their values and writes."""
    if not chosen:
        return []
    params: dict[str, Any] = {
        "key": key,
        "namespaces": [checkpoint_ns for checkpoint_ns, _ in chosen],
        "ids": [checkpoint_id for _, checkpoint_id in chosen],
    }
    cursor = await conn.execute(sql.READ_CHECKPOINTS, params)
    rows = {(row[0], row[1]): row for row in await cursor.fetchall()}
    cursor = await conn.execute(sql.READ_VALUES, params)
    values: dict[tuple[str, str, str], TypedValue] = {}
    for checkpoint_ns, channel, version, type_, blob, base_version in await cursor.fetchall():
        if base_version is None:
            values[(checkpoint_ns, channel, version)] = TypedValue(
                type_, bytes(blob) if blob is not None else None
            )
            continue
        whole = await _resolve(conn, key, checkpoint_ns, channel, version)
        if whole is not None:
            values[(checkpoint_ns, channel, version)] = whole[0]
    cursor = await conn.execute(sql.READ_WRITES, params)
    writes: dict[tuple[str, str], list[CheckpointWrite]] = {}
    for (
        checkpoint_ns,
        checkpoint_id,
        task_id,
        idx,
        channel,
        type_,
        blob,
        task_path,
    ) in await cursor.fetchall():
        writes.setdefault((checkpoint_ns, checkpoint_id), []).append(
            CheckpointWrite(task_id, idx, channel, TypedValue(type_, bytes(blob)), task_path)
        )
    read: list[StoredCheckpoint] = []
    for found in chosen:
        row = rows.get(found)
        if row is None:
            continue  # deleted between the two reads of a page
        checkpoint_ns, checkpoint_id, parent, type_, blob, metadata, channels, versions, at = row
        read.append(
            StoredCheckpoint(
                checkpoint_ns=checkpoint_ns,
                checkpoint_id=checkpoint_id,
                parent_checkpoint_id=parent,
                checkpoint=TypedValue(type_, bytes(blob)),
                metadata_json=metadata,
                channel_versions=dict(zip(channels, versions, strict=True)),
                channel_values=tuple(
                    ChannelValue(channel, version, values[(checkpoint_ns, channel, version)])
                    for channel, version in zip(channels, versions, strict=True)
                    if (checkpoint_ns, channel, version) in values
                ),
                pending_writes=tuple(writes.get(found, ())),
                create_time=at,
            )
        )
    return read
