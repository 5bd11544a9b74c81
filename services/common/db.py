"""PostgreSQL access shared by the services: the embedded server, pools, errors.

The pool is opened explicitly (no I/O in constructors). Driver errors that
mean "the database is not reachable" become `StoreUnavailable` here, at the
adapter boundary, so that domain code and the transport never see psycopg.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from services.common.errors import StoreUnavailable
from services.common.settings import Settings

log = logging.getLogger(__name__)

AsyncConn = AsyncConnection[TupleRow]

# SQLSTATE classes that mean the server or the connection is gone, rather than
# a fault of the statement: connection exceptions, insufficient resources,
# operator intervention (shutdown, and query_canceled: a statement that hit
# statement_timeout because the database is stalled or locked, or that an
# operator cancelled), system errors. All are transient: retry later.
_UNAVAILABLE_SQLSTATE_CLASSES = ("08", "53", "57", "58")


def is_unavailable(error: BaseException) -> bool:
    """True when a driver error means the database cannot serve right now."""
    if isinstance(error, PoolTimeout | psycopg.InterfaceError):
        return True
    if isinstance(error, psycopg.OperationalError):
        sqlstate = error.sqlstate or ""
        return sqlstate == "" or sqlstate[:2] in _UNAVAILABLE_SQLSTATE_CLASSES
    return False


def start_embedded_postgres(data_dir: Path) -> str:
    """Start (or reuse) a real PostgreSQL from the pgserver package; return its URL.

    The server keeps running while this process lives and stops with it.
    """
    import pgserver

    data_dir.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(str(data_dir.resolve()), cleanup_mode="stop")
    url: str = server.get_uri()
    log.info("embedded postgresql started", extra={"data_dir": str(data_dir)})
    return url


class Database:
    """An async connection pool to one PostgreSQL database."""

    def __init__(self, url: str, settings: Settings, *, name: str = "postgresql") -> None:
        self.url = url
        self.name = name
        self._timeout = settings.db_timeout_s
        options = f"-c statement_timeout={settings.db_statement_timeout_ms}"
        self.pool: AsyncConnectionPool[AsyncConn] = AsyncConnectionPool(
            url,
            min_size=settings.db_pool_min,
            max_size=max(settings.db_pool_max, settings.db_pool_min, 1),
            open=False,
            kwargs={
                "autocommit": True,
                "options": options,
                "connect_timeout": max(1, int(settings.db_timeout_s)),
            },
            # No per-checkout health query (it would double the round trips of
            # every call); a broken connection fails its statement, surfaces as
            # STORE_UNAVAILABLE, and the pool replaces it.
            timeout=settings.db_timeout_s,
            # 0: a connection that cannot be re-made is dropped after one quick
            # retry instead of a background retry loop backing off for minutes.
            # The pool grows back on demand: the next request (or health probe)
            # that finds no idle connection opens one, so a returning database
            # is picked up at once (tests/faults/test_postgres_outage.py).
            reconnect_timeout=0,
            name=name,
        )

    async def open(self) -> None:
        """Open the pool, waiting for at least min_size connections."""
        try:
            await self.pool.open(wait=True, timeout=max(self._timeout, 10.0))
        except PoolTimeout as exc:
            raise StoreUnavailable(self.name, "cannot connect to PostgreSQL") from exc

    async def close(self) -> None:
        """Close the pool (idempotent)."""
        await self.pool.close()

    @property
    def closed(self) -> bool:
        """True once the pool is closed or before it was opened."""
        return self.pool.closed

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConn]:
        """A pooled autocommit connection; outages surface as StoreUnavailable."""
        try:
            async with self.pool.connection() as conn:
                yield conn
        except (psycopg.Error, PoolTimeout) as exc:
            if is_unavailable(exc):
                raise StoreUnavailable(self.name) from exc
            raise


async def fetch_one(conn: AsyncConn, query: Any, params: Any = None) -> TupleRow | None:
    """Execute a query and return its first row."""
    cursor = await conn.execute(query, params)
    return await cursor.fetchone()
