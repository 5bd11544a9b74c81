"""WatchConversation on PostgreSQL: the feed's reads (PostgresFeedStore) and the
notifications between processes (PostgresChangeBus).

Notifications: a process that commits a write to a watched conversation
(`conversations.watched_until` in the future, migrations/0004_watch.sql) sends
`NOTIFY runifold_transcript, '<conversation_key>'` after the commit, from a
connection of its own with `synchronous_commit = off`: PostgreSQL serializes the
commits of notifying transactions, so a NOTIFY inside the append's statement
would make every watched append wait for the others' commits and WAL flushes.
Every process listens on one connection of its own (not one per stream). The
payload is the key alone: no content, no namespace, no id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg

from services.common.backoff import backoff
from services.common.domain import Entry
from services.common.postgres.pool import AsyncConn, Database, fetch_one
from services.common.settings import Settings
from services.common.statements import statement
from services.transcript.config import ENTRY_OVERHEAD_BYTES
from services.transcript.feed_model import (
    AppendSlice,
    FeedState,
    Retraction,
    RunningTurn,
    Snapshot,
    TurnTrace,
)
from services.transcript.store import _entry as entry_from_row

log = logging.getLogger(__name__)

CHANNEL = "runifold_transcript"

# The running turns of a conversation `c`: their fencing tokens, compared only.
_RUNNING_TICKETS = """ARRAY(
    SELECT t.ticket FROM transcript.turns AS t
     WHERE t.conversation_key = c.conversation_key
       AND t.state = 'running' AND t.lease_until >= now()
     ORDER BY t.ticket)"""

# The mark is written only when it would lapse soon (opening a stream on a
# conversation this or another process watches already writes nothing), and only
# for a stream that will open: one refused for its sequence or incarnation writes
# nothing.
OPEN_WATCH = f"""
WITH c AS MATERIALIZED (
    SELECT conversation_key, version, last_sequence, incarnation, watched_until
      FROM transcript.conversations
     WHERE namespace = %(namespace)s AND conversation_id = %(conversation_id)s
), marked AS (
    UPDATE transcript.conversations AS u
       SET watched_until = now() + make_interval(secs => %(ttl_s)s)
      FROM c
     WHERE u.conversation_key = c.conversation_key
       AND (c.watched_until IS NULL
            OR c.watched_until < now() + make_interval(secs => %(renew_before_s)s))
       AND %(after)s <= c.last_sequence
       AND (%(incarnation)s = 0 OR c.incarnation = %(incarnation)s)
)
SELECT c.conversation_key, c.version, c.last_sequence, c.incarnation, now(), {_RUNNING_TICKETS}
  FROM c
"""


# A page of entries after %(after)s through `through` (an SQL expression), with the
# append (version) that wrote each: at most `limit` entries, and past the first no
# more than about `max_bytes` of content. The append of an entry is the first whose
# last_sequence reaches it (an index probe on appends_last_sequence).
def _entry_page(through: str) -> str:
    return f"""
e AS (
    SELECT sequence, role, text, tool_calls, tool_call_id, metadata, created_at,
           native_json, retracted_version, retract_time,
           octet_length(text) + coalesce(octet_length(tool_calls::text), 0)
             + coalesce(octet_length(metadata::text), 0)
             + coalesce(octet_length(native_json), 0) AS size
      FROM transcript.entries
     WHERE conversation_key = %(key)s AND sequence > %(after)s AND sequence <= {through}
     ORDER BY sequence
     LIMIT %(limit)s
), page AS (
    SELECT e.*, sum(size) OVER (ORDER BY sequence) - size AS before FROM e
), entry_rows AS (
    SELECT a.version, a.last_sequence, p.sequence, p.role, p.text, p.tool_calls,
           p.tool_call_id, p.metadata, p.created_at, p.native_json, p.retracted_version,
           p.retract_time, p.size
      FROM page AS p
     CROSS JOIN LATERAL (
           SELECT version, last_sequence FROM transcript.appends
            WHERE conversation_key = %(key)s AND last_sequence >= p.sequence
              -- not an append of no entries (state or retractions only) ending there
              AND first_sequence <= p.sequence
            ORDER BY last_sequence
            LIMIT 1) AS a
     WHERE p.before < %(max_bytes)s
)"""


READ_ENTRIES = f"""
WITH {_entry_page("%(through)s")}
SELECT * FROM entry_rows ORDER BY sequence
"""

# One wake-up of a stream in one snapshot: the counters; the running turns and what
# became of the turns the stream reported (by turn id and fencing token: index
# probes on turns and appends by their (conversation_key, turn_id / request_id)
# keys); and the first page of entries after what it delivered. Three kinds of rows
# in one result (`kind`), so that a live append costs the stream one round trip.
READ_STATE = statement(f"""
WITH c AS MATERIALIZED (
    SELECT version, last_sequence, incarnation, now() AS read_time
      FROM transcript.conversations
     WHERE conversation_key = %(key)s
), turn_rows AS (
    SELECT 'running' AS kind, t.turn_id, t.ticket, t.exclusive, t.create_time,
           NULL::text AS state, NULL::bigint AS row_ticket, NULL::text AS reason,
           NULL::bigint AS committed_version
      FROM transcript.turns AS t
     WHERE t.conversation_key = %(key)s AND t.state = 'running' AND t.lease_until >= now()
    UNION ALL
    SELECT 'traced', r.turn_id, r.ticket, NULL, NULL, t.state, t.ticket,
           t.outcome ->> 'reason', a.version
      FROM unnest(%(turn_ids)s::text[], %(tickets)s::bigint[]) AS r(turn_id, ticket)
      LEFT JOIN transcript.turns AS t
             ON t.conversation_key = %(key)s AND t.turn_id = r.turn_id
      LEFT JOIN transcript.appends AS a
             ON a.conversation_key = %(key)s AND a.request_id = r.turn_id
), since AS (
    -- The version after which the stream reports retractions: the one it reached, or
    -- at its start (%(since)s < 0) the version of the append that wrote %(after)s (none
    -- before it delivers an entry: the conversation's version).
    SELECT CASE WHEN %(since)s >= 0 THEN %(since)s
                WHEN %(after)s = 0 THEN (SELECT version FROM c)
                ELSE coalesce((SELECT a.version FROM transcript.appends AS a
                                WHERE a.conversation_key = %(key)s
                                  AND a.last_sequence >= %(after)s
                                  AND a.first_sequence <= %(after)s
                                ORDER BY a.last_sequence LIMIT 1), 0) END AS version
), retracting AS (
    -- The first %(limit)s writes since then that retracted an entry already delivered
    -- (a range of the appends_retracted index: only the writes that retracted any)...
    SELECT a.version, a.commit_time, a.retracted,
           sum(cardinality(a.retracted)) OVER (ORDER BY a.version)
             - cardinality(a.retracted) AS before
      FROM transcript.appends AS a, since, c
     WHERE a.conversation_key = %(key)s AND a.version > since.version
       AND a.version <= c.version AND a.retracted IS NOT NULL
       AND (SELECT min(s) FROM unnest(a.retracted) AS s) <= %(after)s
     ORDER BY a.version
     LIMIT %(limit)s
), retraction_rows AS (
    -- ...and, past the first, no more than about %(limit)s sequences in all.
    SELECT version, commit_time, retracted FROM retracting WHERE before < %(limit)s
), {_entry_page("(SELECT last_sequence FROM c)")}
SELECT c.version, c.last_sequence, c.incarnation, c.read_time, t.*, NULL::bigint[],
       NULL::bigint, NULL::bigint, NULL::bigint, NULL::smallint, NULL::text, NULL::jsonb,
       NULL::text, NULL::jsonb, NULL::timestamptz, NULL::text, NULL::bigint,
       NULL::timestamptz, NULL::bigint
  FROM c LEFT JOIN turn_rows AS t ON true
UNION ALL
SELECT c.version, c.last_sequence, c.incarnation, c.read_time, 'retracted', NULL, NULL, NULL,
       r.commit_time, NULL, NULL, NULL, r.version, r.retracted,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
  FROM c, retraction_rows AS r
UNION ALL
SELECT c.version, c.last_sequence, c.incarnation, c.read_time, 'entry', NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, NULL, x.*
  FROM c, entry_rows AS x
""")


# Every watched conversation of a process in one statement: renew the marks that
# would lapse soon (skipping a row a writer holds: it is renewed next time, well
# before it lapses), and read the counters.
PULSE = f"""
WITH due AS (
    SELECT conversation_key FROM transcript.conversations
     WHERE conversation_key = ANY(%(keys)s::bigint[])
       AND (watched_until IS NULL
            OR watched_until < now() + make_interval(secs => %(renew_before_s)s))
       FOR NO KEY UPDATE SKIP LOCKED
), renewed AS (
    UPDATE transcript.conversations AS u
       SET watched_until = now() + make_interval(secs => %(ttl_s)s)
      FROM due
     WHERE u.conversation_key = due.conversation_key
)
SELECT c.conversation_key, c.version, c.last_sequence, c.incarnation, now(), {_RUNNING_TICKETS}
  FROM transcript.conversations AS c
 WHERE c.conversation_key = ANY(%(keys)s::bigint[])
"""


def _snapshot(row: Sequence[Any]) -> Snapshot:
    key, version, last, incarnation, read_time, running = row
    return Snapshot(key, version, last, incarnation, read_time, tuple(running))


def _slices(rows: Sequence[Sequence[Any]]) -> list[AppendSlice]:
    """Entry rows (version, last_sequence, entry columns..., size) in sequence order,
    grouped by the append that wrote them."""
    groups: list[tuple[int, int, list[Entry], list[int]]] = []
    for version, last, *columns, size in rows:
        if not groups or groups[-1][0] != version:
            groups.append((version, last, [], [0]))
        groups[-1][2].append(entry_from_row(columns))
        groups[-1][3][0] += size
    return [
        AppendSlice(version, last, entries, size + len(entries) * ENTRY_OVERHEAD_BYTES)
        for version, last, entries, (size,) in groups
    ]


class PostgresFeedStore:
    """FeedStore on PostgreSQL (schema `transcript`)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def open_watch(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        after: int,
        incarnation: int,
        ttl_s: float,
        renew_before_s: float,
    ) -> Snapshot | None:
        async with self.db.connection() as conn:
            row = await fetch_one(
                conn,
                OPEN_WATCH,
                {
                    "namespace": namespace,
                    "conversation_id": conversation_id,
                    "after": after,
                    "incarnation": incarnation,
                    "ttl_s": ttl_s,
                    "renew_before_s": renew_before_s,
                },
            )
        return _snapshot(row) if row is not None else None

    async def read_state(
        self,
        key: int,
        reported: Sequence[tuple[str, int]],
        after: int,
        max_entries: int,
        max_bytes: int,
        since: int = -1,
    ) -> FeedState | None:
        async with self.db.connection() as conn:
            cursor = await READ_STATE.execute(
                conn,
                {
                    "key": key,
                    "turn_ids": [turn_id for turn_id, _ in reported],
                    "tickets": [ticket for _, ticket in reported],
                    "after": after,
                    "since": since,
                    "limit": max_entries,
                    "max_bytes": max_bytes,
                },
            )
            rows = await cursor.fetchall()
        if not rows:
            return None
        version, last, incarnation, read_time = rows[0][:4]
        running: list[RunningTurn] = []
        traces: list[TurnTrace] = []
        retractions: list[Retraction] = []
        entry_rows: list[Sequence[Any]] = []
        for row in rows:
            kind, turn_id, ticket, exclusive, start_time, state, row_ticket, reason, committed = (
                row[4:13]
            )
            if kind == "running":
                running.append(RunningTurn(turn_id, ticket, exclusive, start_time))
            elif kind == "traced":
                traces.append(TurnTrace(turn_id, ticket, state, row_ticket, reason, committed))
            elif kind == "retracted":
                retractions.append(Retraction(committed, tuple(sorted(set(row[13]))), start_time))
            elif kind == "entry":
                entry_rows.append(row[14:])
        snapshot = Snapshot(
            key, version, last, incarnation, read_time, tuple(sorted(t.ticket for t in running))
        )
        entry_rows.sort(key=lambda row: int(row[2]))
        retractions.sort(key=lambda retraction: retraction.version)
        return FeedState(snapshot, running, traces, _slices(entry_rows), retractions)

    async def read_entries(
        self, key: int, after: int, through: int, max_entries: int, max_bytes: int
    ) -> list[AppendSlice]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                READ_ENTRIES,
                {
                    "key": key,
                    "after": after,
                    "through": through,
                    "limit": max_entries,
                    "max_bytes": max_bytes,
                },
            )
            return _slices(await cursor.fetchall())

    async def pulse(
        self, keys: Sequence[int], ttl_s: float, renew_before_s: float
    ) -> Mapping[int, Snapshot]:
        async with self.db.connection() as conn:
            cursor = await conn.execute(
                PULSE, {"keys": list(keys), "ttl_s": ttl_s, "renew_before_s": renew_before_s}
            )
            return {row[0]: _snapshot(row) for row in await cursor.fetchall()}


class PostgresChangeBus:
    """ChangeBus on PostgreSQL LISTEN/NOTIFY: one listening and one announcing connection
    per process, each opened when first needed and again after it broke."""

    def __init__(self, url: str, settings: Settings, *, check_s: float = 5.0) -> None:
        self.url = url
        self._connect_timeout = max(1, int(settings.db_timeout_s))
        self._timeout_s = settings.db_timeout_s
        self._statement_timeout_ms = settings.db_statement_timeout_ms
        # A listening connection that is silent this long is asked a question: a peer
        # that vanished without closing the socket is noticed.
        self.check_s = check_s
        self._announcer: AsyncConn | None = None
        self._announcer_pid: int | None = None
        self._lock = asyncio.Lock()
        self._listener: AsyncConn | None = None

    async def _connect(self, options: str) -> AsyncConn:
        return await psycopg.AsyncConnection.connect(
            self.url,
            autocommit=True,
            connect_timeout=self._connect_timeout,
            options=f"-c statement_timeout={self._statement_timeout_ms} {options}".strip(),
        )

    async def listen(self, woken: Callable[[int], None], connected: Callable[[], None]) -> None:
        attempt = 0
        while True:
            try:
                conn = await self._connect("")
                self._listener = conn
                try:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    attempt = 0
                    connected()
                    await self._receive(conn, woken)
                finally:
                    self._listener = None
                    with contextlib.suppress(Exception):
                        await conn.close()
            except (psycopg.Error, OSError, TimeoutError) as error:
                log.warning(
                    "transcript feed: listening connection lost; reconnecting",
                    extra={"error_type": type(error).__name__},
                )
            await asyncio.sleep(backoff(attempt, base_s=0.1, max_s=5.0, jitter=0.5))
            attempt += 1

    async def _receive(self, conn: AsyncConn, woken: Callable[[int], None]) -> None:
        while True:
            async for note in conn.notifies(timeout=self.check_s):
                if note.pid == self._announcer_pid:
                    continue  # this process's own write: its streams were woken already
                try:
                    key = int(note.payload)
                except ValueError:
                    continue
                woken(key)
            await asyncio.wait_for(conn.execute("SELECT 1"), self._timeout_s)

    async def announce(self, keys: Sequence[int]) -> None:
        if not keys:
            return
        async with self._lock:
            # A kept connection may have broken since (a database restart): one more try
            # on a new one, so that the first write after an outage is announced too.
            for attempt in (0, 1):
                kept = self._announcer
                fresh = kept is None or kept.closed
                if kept is None or kept.closed:
                    conn = await self._connect("-c synchronous_commit=off")
                    self._announcer, self._announcer_pid = conn, conn.info.backend_pid
                else:
                    conn = kept
                try:
                    await asyncio.wait_for(
                        conn.execute(
                            "SELECT pg_notify(%s, key::text) FROM unnest(%s::bigint[]) AS key",
                            (CHANNEL, list(keys)),
                        ),
                        self._timeout_s,
                    )
                    return
                except (psycopg.Error, OSError, TimeoutError):
                    self._announcer = None
                    with contextlib.suppress(Exception):
                        await conn.close()
                    if fresh or attempt:
                        raise

    async def close(self) -> None:
        async with self._lock:
            conn, self._announcer = self._announcer, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
