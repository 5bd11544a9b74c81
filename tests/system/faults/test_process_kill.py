"""A service process killed with SIGKILL in the middle of a write load.

The all-in-one server (`python -m services`) runs as its own process. Writers
append with request ids and turners run agent turns with turn ids, each on its
own conversation. Some conversation rows are locked from the test so that the
writes in flight on them are inside PostgreSQL, waiting, when the process is
killed; released after the kill, they commit with nobody left to acknowledge
them. A new process is started on the same database and data folder, and every
client retries what it was not told the outcome of, with the same id. The test
requires that every acknowledged write survived, that every unacknowledged one is
either absent or stored once (and then returned to its retry as a replay), and
that the transcripts hold each write exactly once with no partial append.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest

from services.common import stubs
from services.transcript.appends import statements as append_sql
from tests.support.process import service_process
from tests.support.waiting import wait_for
from tests.system.faults.support import (
    channel_to,
    check_exactly_once,
    run_turner,
    run_writer,
    start_writers,
    stop_tasks,
    stored_appends,
)

if TYPE_CHECKING:
    from runifold.agent.v1.agent_service_pb2_grpc import AgentServiceAsyncStub
    from runifold.transcript.v1.transcript_service_pb2_grpc import TranscriptServiceAsyncStub

pytestmark = pytest.mark.slow

WRITERS, TURNERS = 6, 4
HELD_WRITERS, HELD_TURNERS = 3, 2


@dataclass
class Current:
    """The stubs of the process that is serving now."""

    transcript: TranscriptServiceAsyncStub
    agent: AgentServiceAsyncStub


async def _other_backends(
    conn: psycopg.AsyncConnection[tuple[object, ...]], *, besides: int
) -> list[str]:
    """What the other sessions on this database wait for ('running' when nothing)."""
    cursor = await conn.execute(
        """SELECT coalesce(wait_event_type, 'running') FROM pg_stat_activity
            WHERE datname = current_database() AND pid NOT IN (pg_backend_pid(), %s)
              AND backend_type = 'client backend'""",
        (besides,),
    )
    return [str(row[0]) for row in await cursor.fetchall()]


_APPEND_TEXT = append_sql.APPEND.text.decode()


async def _appends_waiting(
    conn: psycopg.AsyncConnection[tuple[object, ...]], *, besides: int
) -> int:
    """How many sessions wait on a lock inside an append (AppendEntries' statement, which
    a turn's commit runs too): a turn's other statements (its lease, its reads) may wait
    on a lock as well, and a held turner counts only once its append is the one waiting.
    The statement is known by its beginning (pg_stat_activity keeps the first 1 KiB)."""
    cursor = await conn.execute(
        """SELECT count(*) FROM pg_stat_activity
            WHERE datname = current_database() AND pid NOT IN (pg_backend_pid(), %s)
              AND backend_type = 'client backend' AND wait_event_type = 'Lock'
              AND starts_with(query, %s)""",
        (besides, _APPEND_TEXT[:200]),
    )
    row = await cursor.fetchone()
    count = row[0] if row else 0
    assert isinstance(count, int)
    return count


async def test_sigkill_mid_load_loses_no_acknowledged_write(
    fresh_database_url: str, tmp_path: Path
) -> None:
    namespace = f"kill-{uuid.uuid4().hex[:8]}"
    env = {
        "DATABASE_URL": fresh_database_url,
        "RUNIFOLD_DB_POOL_MAX": "16",
        "RUNIFOLD_SUMMARY_WORKERS": "0",
        "RUNIFOLD_AGENT_MODEL_URL": "offline",
        # The held writes must still be waiting when the process is killed.
        "RUNIFOLD_DB_STATEMENT_TIMEOUT_MS": "60000",
    }
    tasks: list[asyncio.Task[None]] = []
    async with contextlib.AsyncExitStack() as stack:
        first = await stack.enter_async_context(service_process("services", env, tmp_path))
        channel = await stack.enter_async_context(channel_to(first.address))
        current = Current(stubs.transcript(channel), stubs.agent(channel))
        appends = await start_writers(current.transcript, namespace, WRITERS)
        turns = await start_writers(current.transcript, namespace, TURNERS)
        tasks += [
            # Paced, so that the turners are not starved on a busy machine.
            asyncio.create_task(
                run_writer(lambda: current.transcript, appends, w, timeout=30.0, pace=0.01)
            )
            for w in appends.writers
        ]
        tasks += [
            asyncio.create_task(run_turner(lambda: current.agent, turns, w)) for w in turns.writers
        ]
        held = [w.conversation_id for w in appends.writers[:HELD_WRITERS]] + [
            w.conversation_id for w in turns.writers[:HELD_TURNERS]
        ]
        assert len(held) == HELD_WRITERS + HELD_TURNERS, "fewer writers than held rows"
        try:
            await appends.progress()
            await turns.progress()

            async with await psycopg.AsyncConnection.connect(fresh_database_url) as locker:
                locker_pid = locker.info.backend_pid
                # Hold the rows as an append does (FOR NO KEY UPDATE): the next append
                # on each waits inside PostgreSQL. A turn's shared lease (FOR KEY
                # SHARE) passes, so the turn's own append is what waits.
                await locker.execute(
                    "SELECT 1 FROM transcript.conversations"
                    " WHERE conversation_id = ANY(%s::uuid[]) FOR NO KEY UPDATE",
                    (held,),
                )
                async with await psycopg.AsyncConnection.connect(
                    fresh_database_url, autocommit=True
                ) as watcher:

                    async def writes_waiting() -> bool:
                        return await _appends_waiting(watcher, besides=locker_pid) >= len(held)

                    await wait_for(writes_waiting, timeout=30)
                    first.process.kill()  # SIGKILL: no shutdown of any kind
                    await first.process.wait()
                    await locker.commit()  # the waiting writes commit, unacknowledged

                    async def orphans_gone() -> bool:
                        return not await _other_backends(watcher, besides=locker_pid)

                    await wait_for(orphans_gone, timeout=30)

            # Each held write is stored, and its client was told nothing but an error.
            held_writers = appends.writers[:HELD_WRITERS] + turns.writers[:HELD_TURNERS]

            async def orphans_stored_unacknowledged() -> bool:
                stored = await stored_appends(fresh_database_url, namespace)
                return all(
                    len(set(w.unknown) & {a.request_id for a in stored[w.conversation_id]}) == 1
                    for w in held_writers
                )

            await wait_for(orphans_stored_unacknowledged, timeout=30)

            second = await stack.enter_async_context(service_process("services", env, tmp_path))
            channel = await stack.enter_async_context(channel_to(second.address))
            current.transcript, current.agent = stubs.transcript(channel), stubs.agent(channel)
            # Every client's retries complete, and each makes progress after them.
            await appends.progress(2, timeout=90)
            await turns.progress(1, timeout=90)
            appends.stopping = turns.stopping = True
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=90)
        finally:
            await stop_tasks(tasks)

    for load in (appends, turns):
        assert all(not w.unknown for w in load.writers)
    assert set(appends.failures) <= {"UNAVAILABLE/-"}, appends.failures
    # A turn whose model call had begun when the process died is final on its retry
    # (TURN_INTERRUPTED: its lease lapsed mid-call; it never commits, the turner goes on
    # under a new turn id): one turn a turner at most, the one in flight at the kill.
    assert set(turns.failures) <= {"UNAVAILABLE/-", "ABORTED/TURN_INTERRUPTED"}, turns.failures
    assert all(len(w.interrupted) <= 1 for w in turns.writers), turns.failures
    # The writes that committed after the kill came back to their retries as replays:
    # at least one per held writer, of each kind.
    assert appends.replays >= HELD_WRITERS, appends.replays
    assert turns.replays >= HELD_TURNERS, turns.replays
    stored = await stored_appends(fresh_database_url, namespace)
    check_exactly_once(appends, stored)
    check_exactly_once(turns, stored)
