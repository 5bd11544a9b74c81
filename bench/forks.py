"""Forks and digests (issue 32).

1. Appends with and without the digest chain, in the same run: TranscriptService's
   append (its domain and its PostgreSQL store, in this process: the part digests
   change) with 1 and 16 writers, each alternating the two op by op (a shared machine's
   noise falls on both alike). Goal: with digests, under 5% lower throughput.
2. ForkConversation through gRPC (the server in its own process) of conversations of
   100 and of 100,000 entries (appends of 100 entries), forked inside an append and at
   the end. Goal: flat (the 100,000 case within 1.3x of the 100 case).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import grpc
import psycopg

from bench.common import Stats, measure, new_database, server_process
from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import migrations, stubs
from services.common.domain import Message, Role
from services.common.pagination import PageTokens
from services.common.postgres.pool import Database
from services.common.settings import Settings
from services.transcript.component import MIGRATIONS
from services.transcript.config import TranscriptLimits
from services.transcript.service import TranscriptService
from services.transcript.store import PostgresTranscriptStore

MESSAGES = [Message(Role.USER, "benchmark message"), Message(Role.ASSISTANT, "an answer")]


async def interleaved(
    on: TranscriptService, off: TranscriptService, concurrency: int, total: int
) -> tuple[Stats, Stats]:
    """Compare-and-swap appends of two messages, each writer alternating one append with
    digests and one without (on conversations of its own for each), so that both see the
    same moments of a shared, noisy machine."""
    namespace = "bench-digests"
    services = (off, on)
    ids = [
        [
            str((await service.create_conversation(namespace, "", {}))[0].conversation_id)
            for service in services
        ]
        for _ in range(concurrency)
    ]
    versions = {cid: 0 for pair in ids for cid in pair}
    latencies: tuple[list[float], list[float]] = ([], [])

    async def worker(w: int) -> None:
        for i in range(total // concurrency):
            which = (i + w) % 2
            cid = ids[w][which]
            start = time.perf_counter()
            result = await services[which].append(namespace, cid, versions[cid], MESSAGES, "")
            latencies[which].append(time.perf_counter() - start)
            versions[cid] = result.record.version

    started = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    elapsed = time.perf_counter() - started
    # Each variant had the writers half of the time: its rate is its count over half of it.
    return tuple(  # type: ignore[return-value]
        Stats(f"append {label}, {concurrency} in flight", found, elapsed / 2)
        for label, found in zip(("without digests", "with digests"), latencies, strict=True)
    )


async def digest_cost(url: str) -> list[str]:
    settings = Settings.from_env(
        {"RUNIFOLD_DB_POOL_MIN": "16", "RUNIFOLD_DB_POOL_MAX": "16", "DATABASE_URL": url}
    )
    db = Database(url, settings)
    await db.open()
    try:
        await migrations.migrate(db, "transcript", MIGRATIONS)
        on = TranscriptService(
            PostgresTranscriptStore(db), TranscriptLimits(), PageTokens(b"bench-secret-0123")
        )
        off = TranscriptService(
            PostgresTranscriptStore(db), TranscriptLimits(), PageTokens(b"bench-secret-0123")
        )
        off.digests = False
        await interleaved(on, off, 1, 200)  # warm-up
        off1, on1 = await interleaved(on, off, 1, 4000)
        off16, on16 = await interleaved(on, off, 16, 16000)
    finally:
        await db.close()

    def ratio(with_digests: Stats, without: Stats) -> float:
        # Mean latencies (one writer's throughput is their inverse).
        return (sum(without.latencies) / len(without.latencies)) / (
            sum(with_digests.latencies) / len(with_digests.latencies)
        )

    return [
        "(the domain and store in this process; each writer alternates the two, op by op)",
        *(s.row() for s in (off1, on1, off16, on16)),
        f"throughput with / without digests at 1 in flight:  {ratio(on1, off1):.3f}",
        f"throughput with / without digests at 16 in flight: {ratio(on16, off16):.3f}"
        "  (goal >= 0.95)",
    ]


def seed(url: str, conversation_id: str, length: int) -> None:
    """`length` entries in appends of 100 (and the append records), written directly."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO transcript.entries (conversation_key, sequence, role, text, created_at)
               SELECT c.conversation_key, s, 1 + (s %% 2), 'message ' || s, now()
                 FROM transcript.conversations c, generate_series(1, %s) AS s
                WHERE c.conversation_id = %s""",
            (length, uuid.UUID(conversation_id)),
        )
        conn.execute(
            """INSERT INTO transcript.appends (conversation_key, version, first_sequence,
                      last_sequence, payload_hash, commit_time)
               SELECT c.conversation_key, v, (v - 1) * 100 + 1, v * 100, '\\x00', now()
                 FROM transcript.conversations c, generate_series(1, %s) AS v
                WHERE c.conversation_id = %s""",
            (length // 100, uuid.UUID(conversation_id)),
        )
        conn.execute(
            "UPDATE transcript.conversations SET version = %s, last_sequence = %s "
            "WHERE conversation_id = %s",
            (length // 100, length, uuid.UUID(conversation_id)),
        )
        conn.execute("ANALYZE transcript.entries")
        conn.execute("ANALYZE transcript.appends")


async def fork_cost(url: str) -> list[str]:
    results: list[Stats] = []
    async with (
        server_process("services.transcript", url) as address,
        grpc.aio.insecure_channel(address) as channel,
    ):
        stub = stubs.transcript(channel)
        namespace = "bench-forks"
        for length in (100, 100_000):
            created = await stub.CreateConversation(
                pb.CreateConversationRequest(namespace=namespace)
            )
            cid = created.conversation.conversation_id
            seed(url, cid, length)
            for label, through in (("inside an append", length - 50), ("at the end", length)):
                request = pb.ForkConversationRequest(
                    namespace=namespace, conversation_id=cid, through_sequence=through
                )

                async def op(
                    _: int, __: int, request: pb.ForkConversationRequest = request
                ) -> None:
                    await stub.ForkConversation(request)

                results.append(
                    await measure(
                        f"gRPC ForkConversation {label}, {length:,} entries",
                        1,
                        300,
                        op,
                        warmup=30,
                    )
                )
    inside = results[2].p50 / results[0].p50
    end = results[3].p50 / results[1].p50
    return [
        *(s.row() for s in results),
        f"fork p50 100,000 / 100 entries: inside an append {inside:.2f}, at the end {end:.2f}"
        "  (goal <= 1.3)",
    ]


async def digests_only(postgres_url: str) -> list[str]:
    return [
        "## Appends with and without digests",
        "",
        *await digest_cost(new_database(postgres_url)),
    ]


async def run(postgres_url: str) -> list[str]:
    url = new_database(postgres_url)
    lines = ["## Forks and digests (TranscriptService)", ""]
    # The server migrates the database first.
    lines += await fork_cost(url)
    lines.append("")
    lines += await digest_cost(url)
    return lines
