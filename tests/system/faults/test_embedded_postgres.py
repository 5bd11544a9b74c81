"""The embedded PostgreSQL after a `kill -9`: of the server, of PostgreSQL, of both.

The all-in-one server (`python -m services`) runs as its own process with no
DATABASE_URL, so it starts PostgreSQL from pgserver in RUNIFOLD_DATA_DIR/postgres.
After each crash the next start must serve with no manual step and keep what was
written, and a clean shutdown (SIGTERM) must then stop the PostgreSQL it runs:
no postgres process of that data directory remains.

The embeddings are configured for a hosted API that is never called (no test
here searches memory): it spares each start the local model's load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil  # type: ignore[import-untyped]  # pgserver's dependency; no type stubs
import psycopg
import pytest

from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs
from services.common.errors import StoreUnavailable
from services.common.postgres.pool import Database
from tests.support.grpc_calls import health_status
from tests.support.process import ServiceProcess, service_process
from tests.support.settings import server_settings
from tests.support.waiting import wait_for
from tests.system.faults.support import NOT_SERVING, channel_to, dedicated_postgres

ENV = {
    "DATABASE_URL": "",  # empty counts as unset: the embedded PostgreSQL
    "RUNIFOLD_AGENT_MODEL_URL": "offline",
    "RUNIFOLD_SUMMARY_WORKERS": "0",
    "RUNIFOLD_DB_POOL_MIN": "1",
    "RUNIFOLD_EMBEDDINGS": "openai",
    "RUNIFOLD_EMBEDDINGS_URL": "http://127.0.0.1:9/v1",
    "RUNIFOLD_EMBEDDINGS_MODEL": "unused",
    "RUNIFOLD_EMBEDDINGS_DIMENSION": "8",
}
NAMESPACE = "embedded-pg"

pytestmark = pytest.mark.slow


def _postgres_of(pgdata: Path) -> list[psutil.Process]:
    """The live postgres processes working in `pgdata` (postmaster and backends)."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if (
                process.name() == "postgres"
                and process.status() != psutil.STATUS_ZOMBIE
                and Path(process.cwd()) == pgdata
            ):
                found.append(process)
    return found


def _postmaster(pgdata: Path) -> list[str]:
    return (pgdata / "postmaster.pid").read_text().splitlines()


def _url(pgdata: Path) -> str:
    """A URL to the embedded server, from its postmaster.pid (unix socket folder)."""
    return f"postgresql://postgres:@/postgres?host={_postmaster(pgdata)[4].strip()}"


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """RUNIFOLD_DATA_DIR for the server processes. Not under pytest's tmp_path: as
    root, pgserver runs PostgreSQL as another user and opens the folder's parents
    to it, and a concurrent pytest session closes /tmp/pytest-of-root again (0700).
    Whatever postgres a failed test left there is killed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="runifold-embedded-pg-")).resolve()
    yield folder
    for process in _postgres_of(folder / "postgres"):
        with contextlib.suppress(psutil.Error):
            process.kill()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def pgdata(data_dir: Path) -> Path:
    """The embedded server's data directory (start_embedded_postgres resolves it)."""
    return data_dir / "postgres"


async def _create(server: ServiceProcess) -> str:
    async with channel_to(server.address) as channel:
        reply = await stubs.transcript(channel).CreateConversation(
            pb.CreateConversationRequest(namespace=NAMESPACE), timeout=10
        )
    return reply.conversation.conversation_id


async def _still_there(server: ServiceProcess, conversation_id: str) -> None:
    async with channel_to(server.address) as channel:
        reply = await stubs.transcript(channel).GetConversation(
            pb.GetConversationRequest(namespace=NAMESPACE, conversation_id=conversation_id),
            timeout=10,
        )
    assert reply.conversation.conversation_id == conversation_id


async def _none_left(pgdata: Path) -> None:
    async def gone() -> bool:
        return not _postgres_of(pgdata)

    try:
        await wait_for(gone, timeout=15)
    except AssertionError:
        left = [(p.pid, " ".join(p.cmdline())) for p in _postgres_of(pgdata)]
        raise AssertionError(f"postgres still running after a clean shutdown: {left}") from None


async def _sigkill(server: ServiceProcess) -> None:
    server.process.kill()
    await server.process.wait()


async def test_server_sigkill_then_restart_serves_and_stops_postgres(
    data_dir: Path, pgdata: Path
) -> None:
    """The killed server's id stays in pgserver's handle list; the next server
    reuses the PostgreSQL that kept running and still stops it on SIGTERM."""
    async with service_process("services", ENV, data_dir) as first:
        conversation = await _create(first)
        postmaster = int(_postmaster(pgdata)[0])
        await _sigkill(first)
    assert psutil.pid_exists(postmaster)  # PostgreSQL outlives a killed server

    async with service_process("services", ENV, data_dir) as second:
        await _still_there(second, conversation)
        assert int(_postmaster(pgdata)[0]) == postmaster  # reused, not restarted
    await _none_left(pgdata)


async def test_server_and_postmaster_sigkill_then_restart_at_once(
    data_dir: Path, pgdata: Path
) -> None:
    """Both killed together and the server started again at once: the killed
    postmaster's postmaster.pid (its id maybe not even reaped yet) is not taken for
    a running server."""
    async with service_process("services", ENV, data_dir) as first:
        conversation = await _create(first)
        postmaster = int(_postmaster(pgdata)[0])
        os.kill(postmaster, signal.SIGKILL)
        await _sigkill(first)

    async with service_process("services", ENV, data_dir) as second:
        await _still_there(second, conversation)
        assert int(_postmaster(pgdata)[0]) != postmaster
    await _none_left(pgdata)


async def test_postmaster_sigkill_under_running_server_then_restart(
    data_dir: Path, pgdata: Path
) -> None:
    """The postmaster is killed under a running server while a backend is busy in a
    long query (it outlives its postmaster and keeps the shared memory attached);
    the server is stopped cleanly and started again."""
    async with service_process("services", ENV, data_dir) as first:
        conversation = await _create(first)
        postmaster = int(_postmaster(pgdata)[0])
        busy = await psycopg.AsyncConnection.connect(_url(pgdata), autocommit=True)
        query = asyncio.create_task(
            busy.execute("SELECT count(*) FROM generate_series(1, 10000000000000)")
        )
        async with await psycopg.AsyncConnection.connect(_url(pgdata), autocommit=True) as watch:

            async def running() -> bool:
                cursor = await watch.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE state = 'active' AND query LIKE '%generate_series%'"
                    " AND pid <> pg_backend_pid()"
                )
                row = await cursor.fetchone()
                return row is not None and row[0] == 1

            await wait_for(running)
        os.kill(postmaster, signal.SIGKILL)

        async def noticed() -> bool:
            return await health_status(first.address) == NOT_SERVING

        await wait_for(noticed, timeout=15)
        orphans = _postgres_of(pgdata)
        assert orphans, "the busy backend should outlive its postmaster"
    # The first server has stopped (SIGTERM); the busy backend is still there.
    assert any(p.is_running() for p in orphans)

    try:
        async with service_process("services", ENV, data_dir) as second:
            await _still_there(second, conversation)
    finally:
        query.cancel()
        with contextlib.suppress(asyncio.CancelledError, psycopg.Error):
            await query
        with contextlib.suppress(psycopg.Error):
            await busy.close()
    await _none_left(pgdata)


async def test_clean_shutdown_after_postmaster_died_as_its_zombie_child(
    data_dir: Path, pgdata: Path
) -> None:
    """The server as a container's PID 1 (tests/system/faults/subreaper.py): the killed
    postmaster stays its unreaped child. SIGTERM still ends the server cleanly
    (pgserver would wait a minute on `pg_ctl stop` of the zombie), and the next
    start serves."""
    async with service_process("tests.system.faults.subreaper", ENV, data_dir) as first:
        conversation = await _create(first)
        postmaster = psutil.Process(int(_postmaster(pgdata)[0]))
        assert postmaster.ppid() == first.process.pid
        postmaster.kill()

        async def zombie() -> bool:
            return bool(postmaster.status() == psutil.STATUS_ZOMBIE)

        await wait_for(zombie)
    assert first.process.returncode == 0, "".join(first.output)[-3000:]

    async with service_process("tests.system.faults.subreaper", ENV, data_dir) as second:
        await _still_there(second, conversation)
    assert second.process.returncode == 0
    await _none_left(pgdata)


async def test_restart_while_postgres_is_still_shutting_down(data_dir: Path, pgdata: Path) -> None:
    """A PostgreSQL left by a killed server is in a smart shutdown (SIGTERM) that a
    client's open session holds up: the next server does not take it for a running
    server, has it stop, and starts its own."""
    async with service_process("services", ENV, data_dir) as first:
        conversation = await _create(first)
        postmaster = int(_postmaster(pgdata)[0])
        await _sigkill(first)
    session = await psycopg.AsyncConnection.connect(_url(pgdata), autocommit=True)
    try:
        os.kill(postmaster, signal.SIGTERM)

        async def stopping() -> bool:
            return _postmaster(pgdata)[7].strip() == "stopping"

        await wait_for(stopping)
        async with service_process("services", ENV, data_dir) as second:
            await _still_there(second, conversation)
            assert int(_postmaster(pgdata)[0]) != postmaster
        with pytest.raises(psycopg.OperationalError):
            await session.execute("SELECT 1")  # ended by the fast shutdown
    finally:
        with contextlib.suppress(psycopg.Error):
            await session.close()
    await _none_left(pgdata)


async def test_pool_waits_for_postgres_that_is_still_starting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Database.open while PostgreSQL is down: it opens once the server is up."""
    caplog.set_level(logging.WARNING)
    async with dedicated_postgres() as server:
        await server.stop()
        db = Database(server.url, server_settings(), name=f"wait-{uuid.uuid4().hex[:6]}")
        opening = asyncio.create_task(db.open())  # at most max(RUNIFOLD_DB_TIMEOUT_S, 10 s)
        try:

            async def refused() -> bool:
                # A connection attempt failed (logged by the pool or by Database).
                return any("connect" in r.getMessage() for r in caplog.records)

            await wait_for(refused)
            assert not opening.done()
            await server.start()
            await opening
            async with db.connection() as conn:
                cursor = await conn.execute("SELECT 1")
                assert await cursor.fetchone() == (1,)
        finally:
            opening.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await opening
            await db.close()


async def test_pool_names_what_failed_when_postgres_never_comes_up(tmp_path: Path) -> None:
    db = Database(
        f"postgresql://postgres:@/postgres?host={tmp_path}", server_settings(), name="nowhere"
    )
    with pytest.raises(StoreUnavailable) as raised:
        await db.open(timeout=1.0)
    message = str(raised.value)
    assert "nowhere" in message and f"host={tmp_path}" in message
    assert "did not accept connections within 1 s" in message
    assert "No such file or directory" in message  # libpq's own reason: no socket
    assert db.closed
