"""The pool's connections are taken in turns by namespace
(services/common/postgres/pool.py): when every connection is busy, one namespace's queue
of calls does not stand in front of another namespace's call. Against a real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextvars

from services.common import admission
from services.common.errors import StoreUnavailable
from services.common.postgres.pool import Database
from tests.support.settings import server_settings
from tests.support.waiting import wait_for


def _as(namespace: str) -> contextvars.Context:
    """A context as the guard leaves it for a call of `namespace`."""
    context = contextvars.copy_context()
    context.run(admission.namespace_var.set, namespace)
    return context


async def test_a_freed_connection_goes_to_the_next_namespace_not_the_next_caller(
    fresh_database_url: str,
) -> None:
    db = Database(fresh_database_url, server_settings(RUNIFOLD_DB_POOL_MAX="2"))
    await db.open()
    order: list[str] = []
    release = asyncio.Event()

    async def use(namespace: str, hold: bool) -> None:
        async with db.connection() as conn:
            await conn.execute("SELECT 1")
            order.append(namespace)
            if hold:
                await release.wait()

    def start(namespace: str, hold: bool = False) -> asyncio.Task[None]:
        return _as(namespace).run(asyncio.ensure_future, use(namespace, hold))

    try:
        holders = [start("flood", hold=True) for _ in range(2)]
        await wait_for(lambda: _now(len(order) == 2))
        queued = [start("flood") for _ in range(6)]
        await wait_for(lambda: _now(db._turns.waiting == 6))
        quiet = start("quiet")  # after the flood's six, in a lane of its own
        await wait_for(lambda: _now(db._turns.waiting == 7))
        release.set()
        await asyncio.gather(*holders, *queued, quiet)
        # Two connections freed at once: the quiet namespace's call is among the next
        # two served, not behind the flood's queue.
        assert "quiet" in order[2:4], order
    finally:
        await db.close()


async def test_a_caller_waits_for_a_connection_at_most_the_store_timeout(
    fresh_database_url: str,
) -> None:
    db = Database(
        fresh_database_url,
        server_settings(RUNIFOLD_DB_POOL_MAX="1", RUNIFOLD_DB_TIMEOUT_S="0.2"),
    )
    await db.open()
    try:
        async with db.connection():
            try:
                async with db.connection():
                    raise AssertionError("a second connection of a pool of one")
            except StoreUnavailable as error:
                assert error.reason == "STORE_UNAVAILABLE"
        assert db._turns.held == 0 and db._turns.waiting == 0
    finally:
        await db.close()


async def _now(value: bool) -> bool:
    return value
