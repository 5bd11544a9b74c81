"""The digest chain in the store: the protocol (`ChainStore`, ListAppends) and its
PostgreSQL adapter. The chain itself is written by the append statement
(appends/statements.py) and by a fork (forks/statements.py).
"""

from __future__ import annotations

import uuid
from typing import Protocol

from services.common.domain import SEQUENCE_MAX
from services.transcript.conversations.store import PostgresBase, prefix_from_columns
from services.transcript.digests import statements as sql
from services.transcript.digests.model import GENESIS, ChainLink, links


class ChainStore(Protocol):
    """The digest chain part of TranscriptStore."""

    async def list_appends(
        self, namespace: str, conversation_id: uuid.UUID, after_version: int, limit: int
    ) -> list[ChainLink] | None:
        """Up to `limit` appends after a version, in order, each with the digest it follows
        (a fork's through its fork point are its lineage's); None when the conversation
        is missing."""


class PostgresChain(PostgresBase):
    """ChainStore on PostgreSQL (schema `transcript`)."""

    async def list_appends(
        self, namespace: str, conversation_id: uuid.UUID, after_version: int, limit: int
    ) -> list[ChainLink] | None:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.CONVERSATION, {"namespace": namespace, "conversation_id": conversation_id}
            )
            row = await cursor.fetchone()
            if row is None:
                return None
            key, *columns = row
            # The version pieces: each segment of the shared prefix, then the conversation's
            # own appends; from the version before the page (its digest comes first).
            low = max(after_version, 1)
            keys, lows, highs = [], [], []
            start = 0
            for segment in (*prefix_from_columns(*columns), None):
                holder = key if segment is None else segment.key
                high = SEQUENCE_MAX if segment is None else segment.through_version
                if max(low, start + 1) <= high:
                    keys.append(holder)
                    lows.append(max(low, start + 1))
                    highs.append(high)
                start = high
            cursor = await conn.execute(
                sql.APPENDS,
                {"keys": keys, "lows": lows, "highs": highs, "limit": limit + 1},
            )
            rows = await cursor.fetchall()
        previous = GENESIS
        if after_version > 0:
            if not rows or rows[0][0] != after_version:
                return []  # past the end
            previous = bytes(rows[0][3]) if rows[0][3] is not None else GENESIS
            rows = rows[1:]
        return links(
            [
                (v, first, last, bytes(d) if d is not None else None, t, r)
                for v, first, last, d, t, r in rows[:limit]
            ],
            previous,
        )
