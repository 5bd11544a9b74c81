"""The notifications between the processes that serve one database: the protocol
(`ChangeBus`) and its PostgreSQL adapter (LISTEN/NOTIFY), for every change feed
(WatchConversation's, services/transcript/watch/; WatchMemories', services/memory/watch/).

A process that commits a write to something watched sends `NOTIFY <channel>,
'<key>'` after the commit, from a connection of its own with `synchronous_commit =
off`: PostgreSQL serializes the commits of notifying transactions, so a NOTIFY inside
the write's statement would make every watched write wait for the others' commits and
WAL flushes. Every process listens on one connection of its own per channel (not one
per stream). The payload is a number alone (the feed's key of what changed): no
content, no namespace, no id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import psycopg

from services.common.backoff import backoff
from services.common.postgres.pool import AsyncConn
from services.common.settings import Settings

log = logging.getLogger(__name__)


class ChangeBus(Protocol):
    """Notifications between the processes that serve one database."""

    async def listen(self, woken: Callable[[int], None], connected: Callable[[], None]) -> None:
        """Run until cancelled: `connected()` each time listening (re)starts, `woken(key)`
        for each key another process announced."""

    async def announce(self, keys: Sequence[int]) -> None:
        """Tell the other processes that what these keys name changed."""

    async def close(self) -> None:
        """Close the connections (idempotent)."""


class PostgresChangeBus:
    """ChangeBus on PostgreSQL LISTEN/NOTIFY on `channel`: one listening and one announcing
    connection per process, each opened when first needed and again after it broke.
    `feed` names the feed in the log ("transcript feed")."""

    def __init__(
        self, url: str, settings: Settings, *, channel: str, feed: str, check_s: float = 5.0
    ) -> None:
        if not channel.isidentifier():
            raise ValueError(f"not a channel name: {channel!r}")
        self.url = url
        self.channel = channel
        self.feed = feed
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
                    await conn.execute(f"LISTEN {self.channel}".encode())
                    attempt = 0
                    connected()
                    await self._receive(conn, woken)
                finally:
                    self._listener = None
                    with contextlib.suppress(Exception):
                        await conn.close()
            except (psycopg.Error, OSError, TimeoutError) as error:
                log.warning(
                    f"{self.feed}: listening connection lost; reconnecting",
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
                            (self.channel, list(keys)),
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
