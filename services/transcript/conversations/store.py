"""Conversations in the store: the protocol (`ConversationStore`) and its PostgreSQL
adapter, and what the other features' adapters share (`PostgresBase`: the pool, and
where committed writes to watched conversations are reported; the rows of a
conversation and of an append record).

Every feature's PostgreSQL adapter is mixed into one `PostgresTranscriptStore`
(services/transcript/store.py), which the in-memory double of the tests mirrors.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

import uuid_utils
from psycopg.types.json import Jsonb

from services.common.domain import Usage
from services.common.errors import DomainError
from services.common.postgres.pool import AsyncConn, Database
from services.transcript.checkpoints import statements as checkpoint_sql
from services.transcript.conversations import statements as sql
from services.transcript.conversations.model import (
    NO_STATE_CHANGE,
    PREVIEW_CHARS,
    PREVIEW_ENTRIES,
    AppendRecord,
    Conversation,
    Deletion,
    ForkOrigin,
    ScopedState,
    Segment,
    StateChange,
    conversation_not_found,
    curated_through_out_of_range,
    incarnation_erased,
    preview,
    state_too_large,
)
from services.transcript.forks.model import forks_changed
from services.transcript.receipts.model import (
    APPENDS,
    CHECKPOINTS,
    ENTRIES,
    FORKS,
    ErasureProgress,
)
from services.transcript.receipts.store import receipt_kept, record_in


class ChangeSink(Protocol):
    """Where a store reports the committed writes of watched conversations."""

    def changed(self, key: int) -> None:
        """Conversation `key` changed (called after the commit; must not block)."""


class ConversationStore(Protocol):
    """The conversations part of TranscriptStore (every method atomic)."""

    async def create_conversation(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        labels: Mapping[str, str],
        user_id: str | None = None,
        state: StateChange = NO_STATE_CHANGE,
        max_state_bytes: int = 64 * 1024,
    ) -> tuple[Conversation, bool]:
        """Insert unless it exists, with the initial state (and the user's and the
        namespace's changes, all in one transaction); return it and whether it was
        created. STATE_TOO_LARGE when a changed document would exceed the limit."""

    async def get_conversation(
        self, namespace: str, conversation_id: uuid.UUID
    ) -> Conversation | None:
        """The conversation, or None (also for another namespace's)."""

    async def list_conversations(
        self,
        namespace: str,
        after: uuid.UUID | None,
        limit: int,
        user_id: str | None = None,
        with_state: bool = False,
        newest_first: bool = False,
        after_time: datetime | None = None,
    ) -> list[Conversation]:
        """Conversations of a namespace (of one user, when given) in id order after the
        id `after`, or newest first (decreasing create_time, then id) after the cursor
        (`after_time`, `after`); their state only when asked (else state_json is "").
        Each carries its `preview`: model.preview() of its first user message that is
        not retracted among its first PREVIEW_ENTRIES entries (read: PREVIEW_CHARS + 1
        characters at most), or "".
        Its cost is the page's: never the namespace's size nor a conversation's length."""

    async def list_namespaces(
        self, after: str, limit: int, among: Sequence[str] | None = None
    ) -> list[str]:
        """Namespaces holding at least one conversation, in name order, after `after`
        (only those among `among`, when given); one index probe for each."""

    async def read_states(self, namespace: str, user_ids: Sequence[str]) -> list[ScopedState]:
        """The stored state documents among these users' ("" for the namespace's)."""

    async def mark_curated(
        self, namespace: str, conversation_id: uuid.UUID, incarnation: int, curated_through: int
    ) -> Conversation:
        """Raise its `curated_through` to this sequence unless it is already higher (only
        the `incarnation` named, when not 0); return it. CONVERSATION_NOT_FOUND,
        CONVERSATION_ERASED (another incarnation) or SEQUENCE_OUT_OF_RANGE writes nothing."""

    async def delete_conversation(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        incarnation: int = 0,
        receipt: ErasureProgress | None = None,
        erased_forks: Collection[tuple[uuid.UUID, int]] | None = None,
    ) -> Deletion:
        """Erase it (only that incarnation, when given) with its forks and theirs (they
        share its entries); return what was erased (the forks' own entries and appends
        included, and how many forks). With a `receipt` (and an incarnation), record the
        incarnation's erasure receipt in the same transaction: `receipt`'s counts and
        remaining parts, with "entries", "appends" and "forks" this call erased
        (ReceiptStore.record_receipt's merge). With `erased_forks` (id, incarnation), a
        fork to erase that is not among them is FORKS_CHANGED, and nothing is deleted."""


def conversation_from_row(row: Sequence[Any], preview_text: str | None = None) -> Conversation:
    """A conversation from its columns (sql.CONVERSATION_COLUMNS), with a listing's
    preview made of the text its statement read (model.preview)."""
    origin_id, through, keys, throughs, versions, head_digest = row[11:17]
    return Conversation(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        row[5],
        row[6] or {},
        row[7],
        row[8],
        row[9],
        row[10] or 0,
        preview(preview_text) if preview_text else "",
        ForkOrigin(origin_id, through) if origin_id is not None else None,
        prefix_from_columns(keys, throughs, versions),
        bytes(head_digest) if head_digest is not None else b"",
    )


def prefix_from_columns(
    keys: Sequence[int] | None, throughs: Sequence[int] | None, versions: Sequence[int] | None
) -> tuple[Segment, ...]:
    """A fork's shared prefix from its three array columns (NULL: no fork)."""
    if not keys or throughs is None or versions is None:
        return ()
    return tuple(Segment(*parts) for parts in zip(keys, throughs, versions, strict=True))


def record_from_row(row: Sequence[Any]) -> AppendRecord:
    """An append record from its columns (version ... payload_hash)."""
    version, first, last, input_tokens, output_tokens, model_calls, commit_time, digest = row
    return AppendRecord(
        version,
        first,
        last,
        Usage(input_tokens, output_tokens, model_calls),
        commit_time,
        bytes(digest) if digest is not None else None,
    )


def state_parameters(state: StateChange) -> dict[str, Any]:
    """A write's state changes as statement parameters (JSON text, cast to jsonb there)."""
    return {
        "conversation_state": state.conversation,
        "user_state": state.user,
        "namespace_state": state.namespace,
    }


def mark_refused(found: Conversation | None, incarnation: int) -> DomainError:
    """Why MarkCurated wrote nothing, given the conversation as it is now."""
    if found is None:
        return conversation_not_found()
    if incarnation and found.incarnation != incarnation:
        return incarnation_erased()
    return curated_through_out_of_range(found.last_sequence)


async def read_conversation(
    conn: AsyncConn, namespace: str, conversation_id: uuid.UUID
) -> Conversation | None:
    """The conversation, read on `conn`; None when it is not in the namespace."""
    cursor = await conn.execute(
        f"""SELECT {sql.CONVERSATION_COLUMNS} FROM transcript.conversations
             WHERE namespace = %s AND conversation_id = %s""",
        (namespace, conversation_id),
    )
    row = await cursor.fetchone()
    return conversation_from_row(row) if row else None


class PostgresBase:
    """What every feature's PostgreSQL adapter holds: the pool, and the sink it tells of
    each committed write to a watched conversation (WatchConversation, and the turn
    leases' waiters)."""

    # Told of each committed change to a watched conversation (WatchConversation).
    changes: ChangeSink | None = None

    def __init__(self, db: Database) -> None:
        self.db = db

    def changed(self, key: int, watched: bool) -> None:
        """A write to conversation `key` committed: wake its watchers, if any."""
        if watched and self.changes is not None:
            self.changes.changed(key)


class PostgresConversations(PostgresBase):
    """ConversationStore on PostgreSQL (schema `transcript`)."""

    async def create_conversation(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        labels: Mapping[str, str],
        user_id: str | None = None,
        state: StateChange = NO_STATE_CHANGE,
        max_state_bytes: int = 64 * 1024,
    ) -> tuple[Conversation, bool]:
        params = {
            "namespace": namespace,
            "conversation_id": conversation_id,
            "labels": Jsonb(dict(labels)),
            "user_id": user_id,
            "max_state_bytes": max_state_bytes,
            **state_parameters(state),
        }
        async with self.db.connection() as conn:
            cursor = await conn.execute(sql.CREATE_CONVERSATION, params)
            row = await cursor.fetchone()
            if row is not None:
                return conversation_from_row(row), True
            existing = await read_conversation(conn, namespace, conversation_id)
            if existing is None and state:
                cursor = await conn.execute(sql.CREATED_STATE_TOO_LARGE, params)
                too_large = await cursor.fetchone()
                if too_large is not None and too_large[0]:
                    raise state_too_large("user", max_state_bytes)
                if too_large is not None and too_large[1]:
                    raise state_too_large("namespace", max_state_bytes)
        if existing is None:  # deleted between the two statements
            raise conversation_not_found()
        return existing, False

    async def get_conversation(
        self, namespace: str, conversation_id: uuid.UUID
    ) -> Conversation | None:
        async with self.db.connection() as conn:
            return await read_conversation(conn, namespace, conversation_id)

    async def list_conversations(
        self,
        namespace: str,
        after: uuid.UUID | None,
        limit: int,
        user_id: str | None = None,
        with_state: bool = False,
        newest_first: bool = False,
        after_time: datetime | None = None,
    ) -> list[Conversation]:
        statement = sql.list_conversations(
            with_state=with_state,
            by_user=user_id is not None,
            newest_first=newest_first,
            after_cursor=after is not None,
        )
        params = {
            "namespace": namespace,
            "user_id": user_id,
            "after": after,
            "after_time": after_time,
            "limit": limit,
            "preview_chars": PREVIEW_CHARS + 1,
            "preview_entries": PREVIEW_ENTRIES,
        }
        async with self.db.connection() as conn:
            cursor = await conn.execute(statement, params)
            # Each row: the key, the conversation's columns, the preview's text.
            return [conversation_from_row(row[1:-1], row[-1]) for row in await cursor.fetchall()]

    async def list_namespaces(
        self, after: str, limit: int, among: Sequence[str] | None = None
    ) -> list[str]:
        async with self.db.connection() as conn:
            if among is None:
                cursor = await conn.execute(sql.LIST_NAMESPACES, {"after": after, "limit": limit})
            else:
                cursor = await conn.execute(
                    sql.LIST_GRANTED_NAMESPACES,
                    {"after": after, "limit": limit, "among": list(among)},
                )
            return [row[0] for row in await cursor.fetchall()]

    async def read_states(self, namespace: str, user_ids: Sequence[str]) -> list[ScopedState]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                """SELECT user_id, state::text, version, update_time
                     FROM transcript.scoped_states
                    WHERE namespace = %s AND user_id = ANY(%s::text[])""",
                (namespace, list(user_ids)),
            )
            return [ScopedState(*row) for row in await cursor.fetchall()]

    async def mark_curated(
        self, namespace: str, conversation_id: uuid.UUID, incarnation: int, curated_through: int
    ) -> Conversation:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                sql.MARK_CURATED,
                {
                    "namespace": namespace,
                    "conversation_id": conversation_id,
                    "incarnation": incarnation,
                    "curated_through": curated_through,
                },
            )
            row = await cursor.fetchone()
            if row is not None:
                return conversation_from_row(row)
            found = await read_conversation(conn, namespace, conversation_id)
        raise mark_refused(found, incarnation)

    async def delete_conversation(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        incarnation: int = 0,
        receipt: ErasureProgress | None = None,
        erased_forks: Collection[tuple[uuid.UUID, int]] | None = None,
    ) -> Deletion:
        async with self.db.connection() as conn, conn.transaction():
            cursor = await conn.execute(
                f"""DELETE FROM transcript.conversations
                    WHERE namespace = %s AND conversation_id = %s
                      AND (%s::bigint = 0 OR incarnation = %s::bigint)
                RETURNING conversation_key, {sql.WATCHED}""",
                (namespace, conversation_id, incarnation, incarnation),
            )
            row = await cursor.fetchone()
            erased = Deletion(False)
            # What it erased, with its forks and theirs: they share its entries (the person
            # asked for them to go), found level by level.
            removed: list[tuple[int, bool]] = []
            if row is not None:
                key, watched = row
                removed.append((key, watched))
                level = [key]
                not_erased = 0
                while level:
                    cursor = await conn.execute(sql.ERASE_FORKS, {"keys": level})
                    rows = await cursor.fetchall()
                    forks = [(fork, bool(seen)) for fork, seen, _, _ in rows]
                    if erased_forks is not None:
                        not_erased += sum(
                            (fork_id, int(fork_incarnation)) not in erased_forks
                            for _, _, fork_id, fork_incarnation in rows
                        )
                    removed.extend(forks)
                    level = [fork for fork, _ in forks]
                if not_erased:
                    # A fork made after the erasure listed the forks (its derived data
                    # not erased): the transaction is rolled back, nothing is deleted.
                    raise forks_changed(not_erased)
                keys = [removed_key for removed_key, _ in removed]
                cursor = await conn.execute(
                    "DELETE FROM transcript.appends WHERE conversation_key = ANY(%s)", (keys,)
                )
                appends: int = cursor.rowcount
                await conn.execute(
                    "DELETE FROM transcript.turns WHERE conversation_key = ANY(%s)", (keys,)
                )
                # LangGraph checkpoints (checkpoints/): the thread goes with its transcript.
                for statement in checkpoint_sql.ERASE:
                    await conn.execute(statement, (keys,))
                cursor = await conn.execute(checkpoint_sql.ERASE_CHECKPOINTS, (keys,))
                checkpoints: int = cursor.rowcount
                cursor = await conn.execute(
                    "DELETE FROM transcript.entries WHERE conversation_key = ANY(%s)", (keys,)
                )
                erased = Deletion(
                    True, cursor.rowcount, appends, forks=len(removed) - 1, checkpoints=checkpoints
                )
            # Only for what this call deleted, or an erasure whose receipt is kept (its
            # retry): never a receipt of a conversation that was not there.
            if (
                receipt is not None
                and incarnation
                and (
                    row is not None
                    or await receipt_kept(conn, namespace, conversation_id, incarnation)
                )
            ):
                counts = {
                    **receipt.counts,
                    ENTRIES: erased.entries,
                    APPENDS: erased.appends,
                    FORKS: erased.forks,
                    CHECKPOINTS: erased.checkpoints,
                }
                kept = await record_in(
                    conn,
                    namespace,
                    conversation_id,
                    incarnation,
                    ErasureProgress(counts, receipt.remaining),
                    uuid.UUID(str(uuid_utils.uuid7())),
                )
                erased = replace(erased, receipt=kept)
        for removed_key, removed_watched in removed:
            self.changed(removed_key, removed_watched)
        return erased
