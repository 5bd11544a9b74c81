"""The thinnest possible gRPC append service, as a benchmark reference.

A bare grpc.aio server (no interceptor, no validation, no idempotency record,
no metrics) whose AppendEntries runs the same raw psycopg compare-and-swap as
the benchmark's baseline. Comparing TranscriptService with it separates what
the Python gRPC stack itself costs from what the service adds.

`python -m bench.floor_server` with DATABASE_URL and RUNIFOLD_LISTEN; it
answers grpc.health.v1 like the real servers so bench.common can wait for it.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from psycopg_pool import AsyncConnectionPool

from runifold.transcript.v1 import transcript_service_pb2 as pb
from runifold.transcript.v1 import transcript_service_pb2_grpc as pb_grpc


class FloorTranscript(pb_grpc.TranscriptServiceServicer):
    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.pool = pool

    async def CreateConversation(
        self, request: pb.CreateConversationRequest, context: Any
    ) -> pb.CreateConversationResponse:
        cid = uuid.uuid4()
        async with self.pool.connection() as conn:
            await conn.execute("INSERT INTO raw_conversations (id) VALUES (%s)", (cid,))
        return pb.CreateConversationResponse(
            conversation=pb.Conversation(conversation_id=str(cid)), created=True
        )

    async def AppendEntries(
        self, request: pb.AppendEntriesRequest, context: Any
    ) -> pb.AppendEntriesResponse:
        cid = uuid.UUID(request.conversation_id)
        async with self.pool.connection() as conn, conn.transaction():
            cursor = await conn.execute(
                "UPDATE raw_conversations SET version = version + 1, "
                "last_sequence = last_sequence + 1 WHERE id = %s AND version = %s "
                "RETURNING version, last_sequence",
                (cid, request.expected_version),
            )
            row = await cursor.fetchone()
            if row is None:
                await context.abort(grpc.StatusCode.ABORTED, "conflict")
            await conn.execute(
                "INSERT INTO raw_entries (conversation_id, sequence, role, text) "
                "VALUES (%s, %s, %s, %s)",
                (cid, row[1], int(request.messages[0].role), request.messages[0].text),
            )
        return pb.AppendEntriesResponse(version=row[0], first_sequence=row[1], last_sequence=row[1])


async def main() -> None:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        os.environ["DATABASE_URL"],
        min_size=16,
        max_size=16,
        open=False,
        kwargs={"autocommit": True},
    )
    await pool.open()
    server = grpc.aio.server()
    # Only the two RPCs the benchmark calls are implemented (the others answer
    # UNIMPLEMENTED from the generated base class).
    pb_grpc.add_TranscriptServiceServicer_to_server(FloorTranscript(pool), server)  # type: ignore[abstract]
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    await checks.set("", health_pb2.HealthCheckResponse.SERVING)
    server.add_insecure_port(os.environ["RUNIFOLD_LISTEN"])
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main())
