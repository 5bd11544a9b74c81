"""The PostgreSQL pool shared by the services, and the errors of its driver.

The pool is opened explicitly (no I/O in constructors). Driver errors that
mean "the database is not reachable" become `StoreUnavailable` here, at the
adapter boundary, so that domain code and the transport never see psycopg; a
data exception (SQLSTATE class 22: a value the database refused) becomes
INVALID_ARGUMENT / INVALID_VALUE, the safety net behind the input rules
(services/common/validation.py), which refuse every value we know PostgreSQL
would, naming the field.

A driver error's text is data: PostgreSQL's message, DETAIL and CONTEXT quote the
value at fault (`CONTEXT: JSON data, line 1: {"card": ...`). Neither reaches a
client or our logs (services/common/logs.py names it by its class and SQLSTATE, in a
logged traceback too), nor the embedded server's own log
(services/common/postgres/embedded.py, `QUIET_SERVER_LOG`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from services.common.admission import namespace_var
from services.common.backoff import backoff
from services.common.errors import DomainError, StoreUnavailable, invalid_argument
from services.common.logs import describe
from services.common.settings import Settings
from services.common.shedding import SlotQueue

log = logging.getLogger(__name__)

AsyncConn = AsyncConnection[TupleRow]

# SQLSTATE classes that mean the server or the connection is gone, rather than
# a fault of the statement: connection exceptions, insufficient resources,
# operator intervention (shutdown, and query_canceled: a statement that hit
# statement_timeout because the database is stalled or locked, or that an
# operator cancelled), system errors. All are transient: retry later.
_UNAVAILABLE_SQLSTATE_CLASSES = ("08", "53", "57", "58")


def is_data_error(error: BaseException) -> bool:
    """True when the database (or the driver, adapting a parameter: a NUL character)
    refused a value: SQLSTATE class 22, psycopg's DataError."""
    return isinstance(error, psycopg.DataError)


def is_unavailable(error: BaseException) -> bool:
    """True when a driver error means the database cannot serve right now."""
    if isinstance(error, PoolTimeout | psycopg.InterfaceError):
        return True
    if isinstance(error, psycopg.OperationalError):
        sqlstate = error.sqlstate or ""
        return sqlstate == "" or sqlstate[:2] in _UNAVAILABLE_SQLSTATE_CLASSES
    return False


# How often opening the pool looks again for a server that is still starting.
_POLL_S = 0.05


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
            # is picked up at once (tests/system/faults/test_postgres_outage.py).
            reconnect_timeout=0,
            name=name,
        )
        # The pool's connections, taken in turns by namespace (connection()); the queue
        # is bounded by the calls in flight (RUNIFOLD_MAX_CONCURRENT_RPCS), not here.
        self._turns = SlotQueue("database", self.pool.max_size, max_queued=1_000_000)

    async def open(self, timeout: float | None = None) -> None:
        """Open the pool once PostgreSQL accepts connections, waiting for one that is
        still starting (crash recovery, a container started beside this one) for at
        most `timeout` seconds (default: RUNIFOLD_DB_TIMEOUT_S, at least 10 s).

        The pool itself cannot wait: with reconnect_timeout=0 a connection that
        fails while the pool fills is given up, and the pool then waits out its whole
        timeout ("pool initialization incomplete") even if PostgreSQL came up.
        A pool with min_size 0 opens without connecting, as before.
        """
        budget = max(self._timeout, 10.0) if timeout is None else timeout
        deadline = time.monotonic() + budget
        if self.pool.min_size > 0:
            await self._until_accepting(deadline, budget)
        try:
            await self.pool.open(wait=True, timeout=max(deadline - time.monotonic(), 1.0))
        except PoolTimeout as exc:
            raise StoreUnavailable(
                self.name,
                f"{self.name}: PostgreSQL ({self._where()}) accepted a connection, but the "
                f"pool did not open its {self.pool.min_size} connections within {budget:g} s",
            ) from exc

    async def _until_accepting(self, deadline: float, budget: float) -> None:
        """Connect once (and close) as soon as PostgreSQL accepts; StoreUnavailable
        naming the server and its last error at the deadline."""
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            try:
                probe = await psycopg.AsyncConnection.connect(
                    self.url, autocommit=True, connect_timeout=max(1, int(remaining))
                )
            except psycopg.OperationalError as exc:
                # Connection errors carry no SQLSTATE (libpq gives only a message):
                # "starting up", a refused socket and a bad password look alike, so
                # all are retried until the deadline and the last one is reported.
                if attempt == 0:
                    log.warning(
                        "waiting for PostgreSQL to accept connections",
                        extra={"store": self.name, "error": str(exc).strip()},
                    )
                if time.monotonic() + _POLL_S > deadline:
                    raise StoreUnavailable(
                        self.name,
                        f"{self.name}: PostgreSQL ({self._where()}) did not accept "
                        f"connections within {budget:g} s: {str(exc).strip()}",
                    ) from exc
                await asyncio.sleep(backoff(attempt, base_s=_POLL_S, max_s=0.5))
                attempt += 1
                continue
            await probe.close()
            return

    def _where(self) -> str:
        """The server's address from the URL, without its password."""
        try:
            params = conninfo_to_dict(self.url)
        except psycopg.ProgrammingError:
            return "an unparsable DATABASE_URL"
        return " ".join(f"{k}={params[k]}" for k in ("host", "port", "dbname") if k in params)

    async def close(self) -> None:
        """Close the pool (idempotent)."""
        await self.pool.close()

    @property
    def closed(self) -> bool:
        """True once the pool is closed or before it was opened."""
        return self.pool.closed

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConn]:
        """A pooled autocommit connection; outages surface as StoreUnavailable.

        Callers take turns for the pool's connections by namespace (the namespace of
        the call being served; background work has a lane of its own): when every
        connection is busy, a connection freed goes to the next namespace waiting, so
        one namespace's flood of calls waits behind itself, not in front of another
        namespace's call. Waiting longer than RUNIFOLD_DB_TIMEOUT_S is
        STORE_UNAVAILABLE, as the pool's own timeout was."""
        try:
            started = await self._turns.acquire(self._timeout, namespace_var.get() or "")
        except DomainError as exc:  # every connection stayed busy until the timeout
            raise StoreUnavailable(self.name) from exc
        try:
            async with self.pool.connection() as conn:
                yield conn
        except (psycopg.Error, PoolTimeout) as exc:
            if is_unavailable(exc):
                raise StoreUnavailable(self.name) from exc
            if is_data_error(exc):
                # Every rule we know is checked before, naming its field: reaching this
                # is a rule missing there. Neither the response nor the log gets the
                # driver's text.
                log.warning(
                    "the database refused a value of a request",
                    extra={"store": self.name, "error": describe(exc)},
                )
                raise invalid_argument(
                    "INVALID_VALUE", "a value of the request cannot be stored"
                ) from None
            raise
        finally:
            self._turns.release(started)


async def fetch_one(conn: AsyncConn, query: Any, params: Any = None) -> TupleRow | None:
    """Execute a query and return its first row."""
    cursor = await conn.execute(query, params)
    return await cursor.fetchone()
