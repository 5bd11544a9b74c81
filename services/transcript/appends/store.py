"""Appends in the store: the protocol (`AppendStore`) and its PostgreSQL adapter.

An append is ONE SQL statement run in autocommit: the compare-and-swap bump
of the conversation row, the append record (whose unique index on request
id makes idempotency exact) and the entries. If any part fails, e.g. the
request id was already recorded, PostgreSQL aborts the whole statement and
nothing is written. Only when the statement wrote nothing do we look at why
(missing conversation, version conflict, replay, a turn lease that refuses it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

import psycopg

from services.common.errors import VersionConflict
from services.transcript import metrics
from services.transcript.appends import statements as sql
from services.transcript.appends.model import (
    AppendResult,
    NewAppend,
    entry_not_retractable,
    no_user,
)
from services.transcript.conversations.model import (
    AppendRecord,
    conversation_not_found,
    request_id_reused,
    state_too_large,
)
from services.transcript.conversations.store import (
    PostgresBase,
    record_from_row,
    state_parameters,
)
from services.transcript.leases.model import conversation_busy, turn_lease_lost


class AppendStore(Protocol):
    """The appends part of TranscriptStore."""

    async def append(self, append: NewAppend) -> AppendResult:
        """Commit entries at the expected version, or replay the recorded request.

        Raises VersionConflict, CONVERSATION_NOT_FOUND or REQUEST_ID_REUSED and
        then writes nothing.
        """


def append_parameters(append: NewAppend) -> dict[str, Any]:
    """The parameters of the append statement.

    The messages travel as ONE jsonb parameter, their canonical JSON, which the
    domain already computed to hash them: adapting one string is far cheaper
    than five arrays.
    """
    messages = append.messages
    return {
        "namespace": append.namespace,
        "conversation_id": append.conversation_id,
        "expected_version": append.expected_version,
        "count": len(messages),
        "request_id": append.request_id,
        "payload_hash": append.payload_hash,
        "input_tokens": append.usage.input_tokens,
        "output_tokens": append.usage.output_tokens,
        "model_calls": append.usage.model_calls,
        "messages": append.encoded,
        "fencing_token": append.fencing_token,
        "retract": list(append.retract) or None,
        "max_state_bytes": append.max_state_bytes,
        "digest_body": append.digest_body,
        **state_parameters(append.state),
    }


# An append that wrote nothing although nothing refuses it any more is tried again, this
# many times at most (what stopped it ended between the statement and the diagnosis).
_ROUNDS = 3


class PostgresAppends(PostgresBase):
    """AppendStore on PostgreSQL (schema `transcript`)."""

    async def append(self, append: NewAppend) -> AppendResult:
        params = append_parameters(append)
        for _ in range(_ROUNDS):
            async with self.db.connection() as conn:
                try:
                    cursor = await sql.APPEND.execute(conn, params)
                    row = await cursor.fetchone()
                except psycopg.errors.UniqueViolation:
                    row = None  # the request id is recorded: nothing was written; replay below
                if row is not None:
                    (
                        version,
                        last,
                        commit_time,
                        user_version,
                        namespace_version,
                        key,
                        watched,
                        digest,
                    ) = row
                    self.changed(key, watched)
                    return AppendResult(
                        AppendRecord(
                            version,
                            last - len(append.messages) + 1,
                            last,
                            append.usage,
                            commit_time,
                            append.payload_hash,
                            bytes(digest) if digest is not None else b"",
                        ),
                        replayed=False,
                        user_state_version=user_version or 0,
                        namespace_state_version=namespace_version or 0,
                    )
                cursor = await conn.execute(sql.WHY_NOT_APPENDED, params)
                why = await cursor.fetchone()
            replayed = _refused(append, why)
            if replayed is not None:
                return replayed
            # Nothing refuses it now: what stopped the statement (a lease that lapsed or
            # ended, a write that committed) is gone between the two reads; try again.
        assert why is not None
        metrics.APPEND_CONFLICTS.inc()
        raise VersionConflict(why[0], append.expected_version or why[0])


def _refused(append: NewAppend, why: Any) -> AppendResult | None:
    """Why an append that wrote nothing did not: raise its error, or return the replay of
    its request id; None when nothing refuses it any more (it may be tried again)."""
    if why is None:
        raise conversation_not_found()
    if why[1] is not None:
        record = record_from_row(why[1:9])
        if record.payload_hash != append.payload_hash:
            raise request_id_reused()
        digest = bytes(why[18]) if why[18] is not None else b""
        return AppendResult(replace(record, digest=digest), replayed=True)
    holder, lease_live, lease_fencing_token, own_live = why[9:13]
    if append.fencing_token is not None and not own_live:
        metrics.TURN_FENCING_TOKEN_REFUSALS.inc()
        raise turn_lease_lost()
    if lease_live and lease_fencing_token != append.fencing_token:
        metrics.TURN_BUSY_REFUSALS.labels("append").inc()
        raise conversation_busy(holder)
    if append.expected_version is not None and why[0] != append.expected_version:
        metrics.APPEND_CONFLICTS.inc()
        raise VersionConflict(why[0], append.expected_version)
    # At the version the write expected (or at any): a rule of its own may refuse it.
    no_user_set, unretractable, *too_large = why[13:18]
    if append.state.user is not None and no_user_set:
        raise no_user()
    if unretractable is not None:
        raise entry_not_retractable(unretractable)
    scopes = ("conversation", "user", "namespace")
    for scope, exceeded in zip(scopes, too_large, strict=True):
        if exceeded:
            raise state_too_large(scope, append.max_state_bytes)
    return None
