"""WatchMemories across replicas: two MemoryService processes (`python -m services.memory`,
the pgvector index, one database) beside a TranscriptService process; racing writers on
one replica make every kind of change, a watcher on the other follows the namespace.

The watching process's pulse is set to an hour, so that what it delivers can only have
come through PostgreSQL's LISTEN/NOTIFY from the writing process.
"""

from __future__ import annotations

import asyncio
import collections
import uuid
from pathlib import Path
from typing import Any

import grpc
import psycopg
from google.protobuf import duration_pb2, timestamp_pb2

from runifold.memory.v1 import memory_service_pb2 as pb
from services.common import stubs
from tests.memory.watch.support import (
    KINDS,
    Watcher,
    check_exactly_once_in_order,
    conversation,
    source,
)
from tests.support.fake_openai import FakeOpenAI
from tests.support.process import service_process, value

WRITERS = 4


def _memory_env(database_url: str, transcript: str, model: FakeOpenAI) -> dict[str, str]:
    """A MemoryService replica: pgvector in the shared database, embeddings from the fake
    (no local model to load), the transcript process for the source checks."""
    return {
        "DATABASE_URL": database_url,
        "TRANSCRIPT_SERVICE_ADDR": transcript,
        "RUNIFOLD_MEMORY_INDEX": "pgvector",
        "RUNIFOLD_EMBEDDINGS": "openai",
        "RUNIFOLD_EMBEDDINGS_URL": model.base_url,
        "RUNIFOLD_EMBEDDINGS_MODEL": "fake-embeddings",
        "RUNIFOLD_EMBEDDINGS_DIMENSION": "8",
    }


def _bare(change: pb.MemoryEvent) -> pb.MemoryEvent:
    """The change without its memory."""
    bare = pb.MemoryEvent()
    bare.CopyFrom(change)
    bare.ClearField("memory")
    return bare


async def _history(database_url: str, namespace: str) -> list[tuple[str, int, int]]:
    """What the namespace's history holds, by change sequence: (memory id, revision,
    change sequence)."""
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute(
            """SELECT memory_id::text, revision, change_sequence FROM memory.revisions
                WHERE namespace = %s ORDER BY change_sequence""",
            (namespace,),
        )
        return [(str(m), int(r), int(s)) for m, r, s in await cursor.fetchall()]


async def test_a_watcher_on_one_replica_sees_every_change_of_racing_writers_on_another(
    fresh_database_url: str, tmp_path: Path, model: FakeOpenAI
) -> None:
    namespace = f"replicas-{uuid.uuid4().hex[:8]}"
    other = f"{namespace}-other"
    async with service_process(
        "services.transcript", {"DATABASE_URL": fresh_database_url}, tmp_path / "t"
    ) as transcript_process:
        env = _memory_env(fresh_database_url, transcript_process.address, model)
        async with (
            service_process(
                "services.memory", {**env, "RUNIFOLD_MEMORY_WATCH_POLL_S": "3600"}, tmp_path / "a"
            ) as watching,
            service_process(
                "services.memory",
                {**env, "RUNIFOLD_MEMORY_SWEEP_INTERVAL_S": "0.2"},
                tmp_path / "b",
            ) as writing,
            grpc.aio.insecure_channel(watching.address) as to_watching,
            grpc.aio.insecure_channel(writing.address) as to_writing,
            grpc.aio.insecure_channel(transcript_process.address) as to_transcript,
        ):
            watcher_stub, writer = stubs.memory(to_watching), stubs.memory(to_writing)
            transcript = stubs.transcript(to_transcript)
            follower = await Watcher(
                watcher_stub, pb.WatchMemoriesRequest(namespace=namespace)
            ).caught_up()
            theirs = await Watcher(
                watcher_stub, pb.WatchMemoriesRequest(namespace=other)
            ).caught_up()
            assert value(await watching.scrape(), "runifold_memory_watchers") == 2

            # What each memory must go through, in its order: (kind, revision).
            expected: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)

            async def upsert(content: str, cid: str, **fields: Any) -> pb.UpsertMemoryResponse:
                request = pb.UpsertMemoryRequest(namespace=namespace, content=content, **fields)
                if not request.sources:
                    request.sources.append(source(cid))
                return await writer.UpsertMemory(request)

            async def write(w: int) -> None:
                cid = await conversation(transcript, namespace)
                made = []
                for i in range(4):
                    reply = await upsert(f"w{w} fact {i}", cid)
                    made.append(reply.memory.memory_id)
                    expected[reply.memory.memory_id].append(("created", 1))
                await upsert(f"w{w} fact 0, again", cid, memory_id=made[0], expected_revision=1)
                expected[made[0]].append(("updated", 2))
                now = timestamp_pb2.Timestamp()
                now.GetCurrentTime()
                newer = await upsert(
                    f"w{w} fact 1, newer",
                    cid,
                    valid_from_time=now,
                    supersedes=[pb.SupersededMemory(memory_id=made[1])],
                )
                expected[newer.memory.memory_id].append(("created", 1))
                expected[made[1]].append(("superseded", 2))
                await writer.DeleteMemory(
                    pb.DeleteMemoryRequest(namespace=namespace, memory_id=made[2])
                )
                expected[made[2]].append(("deleted", 2))
                # Deleting the newer fact reopens the one it superseded.
                await writer.DeleteMemory(
                    pb.DeleteMemoryRequest(namespace=namespace, memory_id=newer.memory.memory_id)
                )
                expected[newer.memory.memory_id].append(("deleted", 2))
                expected[made[1]].append(("updated", 3))
                lapsing = await upsert(f"w{w} lapsing", cid, ttl=duration_pb2.Duration(seconds=1))
                expected[lapsing.memory.memory_id] += [("created", 1), ("expired", 2)]
                erased = await upsert(f"w{w} erased", cid, sources=[source(cid, 2, 2)])
                expected[erased.memory.memory_id].append(("created", 1))
                forgot = await writer.ForgetSource(
                    pb.ForgetSourceRequest(
                        namespace=namespace,
                        conversation_id=cid,
                        from_sequence=2,
                        through_sequence=2,
                    )
                )
                assert forgot.deleted_count == 1
                expected[erased.memory.memory_id].append(("erased", 2))

            await asyncio.gather(*(write(w) for w in range(WRITERS)))
            total = sum(len(changes) for changes in expected.values())
            await follower.until_sequence(total)

            # Every change once, in order, exactly as the history numbered them.
            check_exactly_once_in_order(follower.sequences(), 0, total)
            history = await _history(fresh_database_url, namespace)
            assert [(c.memory_id, c.revision, c.change_sequence) for c in follower.changes()] == (
                history
            )
            delivered: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
            for change in follower.changes():
                delivered[change.memory_id].append((KINDS[change.kind], change.revision))
            assert delivered == expected

            # A stream resumed from the middle, on the writing replica: the rest, once.
            middle = total // 2
            resumed = await Watcher(
                writer, pb.WatchMemoriesRequest(namespace=namespace, after_change_sequence=middle)
            ).caught_up()
            check_exactly_once_in_order(resumed.sequences(), middle, total)
            # The same changes (a memory removed since comes without its content).
            assert [_bare(c) for c in resumed.changes()] == [
                _bare(c) for c in follower.changes()[middle:]
            ]
            await resumed.close()

            # The other namespace's stream saw nothing of it.
            assert theirs.changes() == [] and not theirs.ended
            scraped = await watching.scrape()
            for watcher in (follower, theirs):
                await watcher.close()
            assert value(scraped, "runifold_memory_watch_events_total", event="erased") == WRITERS
            assert value(scraped, "runifold_memory_watch_events_total", event="expired") == WRITERS
            assert value(scraped, "runifold_memory_watch_delivery_seconds_count") == total
