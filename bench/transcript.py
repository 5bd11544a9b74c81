"""TranscriptService benchmarks (issue 2).

1. AppendEntries through gRPC (server in its own process) with 1 and 16 calls
   in flight, against raw psycopg compare-and-swap appends (UPDATE ... WHERE
   version = v, then INSERT, in one transaction) on the same database in the
   same run. Goal: at 16 in flight, at least 0.6 of the raw rate.
   A third contender, bench/floor_server.py, is the thinnest possible gRPC
   service around that same raw append: it shows what the Python gRPC stack
   alone costs on this machine, so the service's own overhead is the gap
   between it and TranscriptService.
2. LoadView p50 with window 16 at 100, 10,000 and 100,000 entries. Goal: the
   100,000 case within 1.3x of the 100 case.
"""

from __future__ import annotations

import uuid

import grpc
import psycopg
from psycopg_pool import AsyncConnectionPool

from bench.common import Stats, measure, median_round, new_database, server_process
from runifold.common.v1 import common_pb2
from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs

ROUNDS = 3

RAW_SCHEMA = """
CREATE TABLE raw_conversations (id uuid PRIMARY KEY, version bigint NOT NULL DEFAULT 0,
                                last_sequence bigint NOT NULL DEFAULT 0);
CREATE TABLE raw_entries (conversation_id uuid NOT NULL, sequence bigint NOT NULL,
                          role smallint NOT NULL, text text NOT NULL,
                          created_at timestamptz NOT NULL DEFAULT now(),
                          PRIMARY KEY (conversation_id, sequence));
"""


async def raw_appends(url: str, concurrency: int, total: int) -> Stats:
    """The floor: the same compare-and-swap append written directly with psycopg."""
    async with AsyncConnectionPool(
        url, min_size=concurrency, max_size=concurrency, kwargs={"autocommit": True}
    ) as pool:
        ids = [uuid.uuid4() for _ in range(concurrency)]
        versions = dict.fromkeys(ids, 0)
        async with pool.connection() as conn:
            for cid in ids:
                await conn.execute("INSERT INTO raw_conversations (id) VALUES (%s)", (cid,))

        async def op(worker: int, _: int) -> None:
            cid = ids[worker]
            async with pool.connection() as conn, conn.transaction():
                cursor = await conn.execute(
                    "UPDATE raw_conversations SET version = version + 1, "
                    "last_sequence = last_sequence + 1 WHERE id = %s AND version = %s "
                    "RETURNING last_sequence",
                    (cid, versions[cid]),
                )
                row = await cursor.fetchone()
                if row is None:
                    raise RuntimeError("unexpected conflict")
                await conn.execute(
                    "INSERT INTO raw_entries (conversation_id, sequence, role, text) "
                    "VALUES (%s, %s, 1, %s)",
                    (cid, row[0], "benchmark message"),
                )
            versions[cid] += 1

        return await measure(
            f"raw psycopg CAS append, {concurrency} in flight", concurrency, total, op
        )


async def grpc_appends(
    address: str, namespace: str, concurrency: int, total: int, label: str = "gRPC AppendEntries"
) -> Stats:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = stubs.transcript(channel)
        ids = [
            (
                await stub.CreateConversation(pb.CreateConversationRequest(namespace=namespace))
            ).conversation.conversation_id
            for _ in range(concurrency)
        ]
        versions = dict.fromkeys(ids, 0)
        message = common_pb2.Message(role=common_pb2.ROLE_USER, text="benchmark message")

        async def op(worker: int, _: int) -> None:
            cid = ids[worker]
            reply = await stub.AppendEntries(
                pb.AppendEntriesRequest(
                    conversation_id=cid,
                    namespace=namespace,
                    expected_version=versions[cid],
                    messages=[message],
                )
            )
            versions[cid] = reply.version

        return await measure(f"{label}, {concurrency} in flight", concurrency, total, op)


async def load_views(address: str, url: str, namespace: str) -> list[Stats]:
    results = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = stubs.transcript(channel)
        for length in (100, 10_000, 100_000):
            cid = (
                await stub.CreateConversation(pb.CreateConversationRequest(namespace=namespace))
            ).conversation.conversation_id
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    """INSERT INTO transcript.entries
                              (conversation_key, sequence, role, text, created_at)
                       SELECT c.conversation_key, s, 1 + (s %% 2), 'message ' || s, now()
                         FROM transcript.conversations c, generate_series(1, %s) AS s
                        WHERE c.conversation_id = %s""",
                    (length, uuid.UUID(cid)),
                )
                conn.execute(
                    "UPDATE transcript.conversations SET version = 1, "
                    "last_sequence = %s WHERE conversation_id = %s",
                    (length, uuid.UUID(cid)),
                )
                conn.execute("ANALYZE transcript.entries")
            # The same answer at every length: 16 in the window, a full buffer of
            # 64 and 4 more behind it; only the transcript's length differs.
            request = pb.LoadViewRequest(
                conversation_id=cid,
                namespace=namespace,
                window=16,
                summary_batch=64,
                summarized_through=length - 16 - 64 - 4,
            )

            async def op(_: int, __: int, request: pb.LoadViewRequest = request) -> None:
                await stub.LoadView(request)

            results.append(
                await measure(
                    f"gRPC LoadView window 16, {length:,} entries", 1, 1000, op, warmup=100
                )
            )
    return results


async def run(postgres_url: str) -> list[str]:
    url = new_database(postgres_url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(RAW_SCHEMA.encode())
    lines = ["## TranscriptService", ""]
    async with server_process(
        "services.transcript", url, {"RUNIFOLD_DB_POOL_MIN": "16", "RUNIFOLD_DB_POOL_MAX": "16"}
    ) as address:
        namespace = "bench"
        # The machine is noisy: alternate the contenders over several rounds and
        # keep each one's median round.
        rounds: dict[str, list[Stats]] = {
            k: [] for k in ("raw1", "floor1", "ours1", "raw16", "floor16", "ours16")
        }
        async with server_process("bench.floor_server", url) as floor:
            for _ in range(ROUNDS):
                rounds["raw1"].append(await raw_appends(url, 1, 1000))
                rounds["floor1"].append(
                    await grpc_appends(floor, namespace, 1, 1000, "bare gRPC + raw CAS")
                )
                rounds["ours1"].append(await grpc_appends(address, namespace, 1, 1000))
                rounds["raw16"].append(await raw_appends(url, 16, 4000))
                rounds["floor16"].append(
                    await grpc_appends(floor, namespace, 16, 4000, "bare gRPC + raw CAS")
                )
                rounds["ours16"].append(await grpc_appends(address, namespace, 16, 4000))
        raw1, floor1, ours1, raw16, floor16, ours16 = (
            median_round(rounds[k])
            for k in ("raw1", "floor1", "ours1", "raw16", "floor16", "ours16")
        )
        views = await load_views(address, url, namespace)
    lines.append(f"(median of {ROUNDS} alternating rounds)")
    lines += [s.row() for s in (raw1, floor1, ours1, raw16, floor16, ours16)]
    lines.append(f"ratio gRPC/raw at 1 in flight:  {ours1.rate / raw1.rate:.2f}")
    lines.append(f"ratio gRPC/raw at 16 in flight: {ours16.rate / raw16.rate:.2f}  (goal >= 0.6)")
    lines.append(
        f"ceiling of any Python gRPC service here (bare gRPC + raw CAS / raw) at 16: "
        f"{floor16.rate / raw16.rate:.2f}; TranscriptService / that ceiling: "
        f"{ours16.rate / floor16.rate:.2f}"
    )
    lines.append("")
    lines += [s.row() for s in views]
    lines.append(
        f"LoadView p50 100,000 / 100 entries: {views[2].p50 / views[0].p50:.2f}  (goal <= 1.3)"
    )
    return lines
