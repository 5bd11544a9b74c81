"""Forks in the store: the protocol (`ForkStore`) and its PostgreSQL adapter.

A fork is one transaction of index probes whatever the length of the prefix it shares:
the source held against erasure (FOR KEY SHARE: appends to it go on), the fork point's
version and state found by a probe per segment of the source's lineage, and two rows
written, the fork and its fork append. No entry is copied.
"""

from __future__ import annotations

import uuid
from typing import Protocol

import psycopg
from psycopg.types.json import Jsonb

from services.common.domain import SEQUENCE_MAX
from services.common.postgres.pool import AsyncConn
from services.transcript.conversations.model import (
    Conversation,
    Segment,
    conversation_not_found,
    request_id_reused,
)
from services.transcript.conversations.store import (
    PostgresBase,
    conversation_from_row,
    prefix_from_columns,
)
from services.transcript.digests.model import GENESIS, body
from services.transcript.forks import statements as sql
from services.transcript.forks.model import (
    ForkRef,
    NewFork,
    chain,
    clip_prefix,
    conversation_exists,
    fork_point_out_of_range,
)
from services.transcript.views.store import entry_from_row, read_prefix


class ForkStore(Protocol):
    """The forks part of TranscriptStore."""

    async def fork_conversation(self, fork: NewFork) -> tuple[Conversation, bool]:
        """Make the fork (or return the one its request id made, with False).

        CONVERSATION_NOT_FOUND for a missing source, SEQUENCE_OUT_OF_RANGE for a fork
        point beyond it, REQUEST_ID_REUSED for a request id that made another fork,
        CONVERSATION_EXISTS for a new id that names another conversation; nothing is
        written then.
        """

    async def list_forks(
        self, namespace: str, conversation_id: uuid.UUID, after_key: int, limit: int
    ) -> list[ForkRef]:
        """At most `limit` of the conversation's forks and theirs whose key is above
        `after_key`, in the order they were made (a fork before its own forks; none when
        it has none or does not exist)."""


class PostgresForks(PostgresBase):
    """ForkStore on PostgreSQL (schema `transcript`)."""

    async def list_forks(
        self, namespace: str, conversation_id: uuid.UUID, after_key: int, limit: int
    ) -> list[ForkRef]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.LIST_FORKS,
                {
                    "namespace": namespace,
                    "conversation_id": conversation_id,
                    "after_key": after_key,
                    "limit": limit,
                },
            )
            rows = await cursor.fetchall()
        return [ForkRef(row[0], int(row[1]), row[2], int(row[3]), int(row[4])) for row in rows]

    async def fork_conversation(self, fork: NewFork) -> tuple[Conversation, bool]:
        for _ in range(2):
            try:
                return await self._fork(fork)
            except psycopg.errors.UniqueViolation:
                # The same request id forked the same source at the same moment: the
                # other committed; the next round replays it.
                continue
        raise conversation_exists()

    async def _fork(self, fork: NewFork) -> tuple[Conversation, bool]:
        params: dict[str, object] = {
            "namespace": fork.namespace,
            "source_id": fork.source_id,
            "request_id": fork.request_id,
        }
        async with self.db.connection() as conn, conn.transaction():
            replayed = await _replay(conn, fork, params)
            if replayed is not None:
                return replayed, False
            cursor = await conn.execute(sql.SOURCE, params)
            source = await cursor.fetchone()
            if source is None:
                raise conversation_not_found()
            key, last, labels, user_id, *prefix_columns = source
            if fork.through_sequence > last:
                raise fork_point_out_of_range(last)
            lineage = chain(prefix_from_columns(*prefix_columns), key)
            version, cut_from, previous = await _fork_point(conn, lineage, fork.through_sequence)
            prefix = clip_prefix(lineage, fork.through_sequence, version)
            state = await _state_at(conn, prefix, lineage[0].key)
            # The entries the fork point cut from an append (at most one append's): the
            # fork append's, in its digest.
            cut = (
                await read_prefix(
                    conn, lineage, key, [(cut_from, fork.through_sequence)], SEQUENCE_MAX
                )
                if cut_from <= fork.through_sequence
                else []
            )
            digest_body = body((), [entry_from_row(row[2:12]).message for row in cut])
            cursor = await conn.execute(
                sql.CREATE_FORK,
                {
                    **params,
                    "conversation_id": fork.conversation_id,
                    "labels": Jsonb(labels or {}),
                    "user_id": user_id,
                    "state": state,
                    "version": version,
                    "through": fork.through_sequence,
                    "cut_from": cut_from,
                    "source_key": key,
                    "prefix_keys": [segment.key for segment in prefix] or None,
                    "prefix_through": [segment.through_sequence for segment in prefix] or None,
                    "prefix_versions": [segment.through_version for segment in prefix] or None,
                    "payload_hash": fork.payload_hash,
                    "previous": previous,
                    "digest_body": digest_body,
                },
            )
            row = await cursor.fetchone()
            if row is None:
                # The id exists: made by the same request a moment ago (it committed while
                # this insert waited for it), or another conversation.
                replayed = await _replay(conn, fork, params)
                if replayed is not None:
                    return replayed, False
                raise conversation_exists()
            return conversation_from_row(row), True


async def _replay(conn: AsyncConn, fork: NewFork, params: dict[str, object]) -> Conversation | None:
    """The fork this request id made of this source, if any (REQUEST_ID_REUSED when it
    asked for another)."""
    if fork.request_id is None:
        return None
    cursor = await conn.execute(sql.REPLAY, params)
    row = await cursor.fetchone()
    if row is None:
        return None
    if bytes(row[-1]) != fork.payload_hash:
        raise request_id_reused()
    return conversation_from_row(row[:-1])


async def _fork_point(
    conn: AsyncConn, lineage: tuple[Segment, ...], through: int
) -> tuple[int, int, bytes]:
    """The fork point's version (the last append of the lineage whose entries all lie at
    or before `through`), the first sequence after that append's, and its digest (the
    fork's chain goes on from it). The appends' last sequences grow with their versions
    along the lineage: the newest segment that holds such an append holds the answer."""
    for segment in reversed(lineage):
        cursor = await conn.execute(
            sql.FORK_POINT,
            {"key": segment.key, "cap": segment.through_version, "through": through},
        )
        row = await cursor.fetchone()
        if row is not None:
            return row[0], row[1] + 1, bytes(row[2]) if row[2] is not None else GENESIS
    return 0, 1, GENESIS


async def _state_at(conn: AsyncConn, prefix: tuple[Segment, ...], root_key: int) -> str:
    """The conversation's state at a fork point: after the newest write of the prefix
    that changed it, else the state the lineage's first conversation was created with."""
    for segment in reversed(prefix):
        cursor = await conn.execute(
            sql.STATE_AT, {"key": segment.key, "cap": segment.through_version}
        )
        row = await cursor.fetchone()
        if row is not None:
            return str(row[0])
    cursor = await conn.execute(sql.INITIAL_STATE, {"key": root_key})
    row = await cursor.fetchone()
    return str(row[0]) if row is not None else "{}"
