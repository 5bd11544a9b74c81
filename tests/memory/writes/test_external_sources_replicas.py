"""ForgetSource by external URI across two MemoryService replicas (`python -m
services.memory`, two processes on one database and one pgvector index): memories
written through one replica from a URI (one of them also from a transcript range) are
forgotten through it, and the other replica's searches return nothing of them, at once
(searches re-read PostgreSQL) and once the index has caught up (the index holds no point
of them); what came from another URI stays. On the wire, a memory still needs a source
of one kind or the other (INVALID_ARGUMENT naming the field).
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2

from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.common import stubs
from services.common.server import serving
from services.memory.config import LOCAL_MODEL_DIMENSION, LOCAL_MODEL_NAME
from services.memory.index.pgvector.adapter import PgvectorIndex
from services.transcript.component import TranscriptComponent
from tests.support.grpc_calls import reason, status_detail
from tests.support.process import service_process
from tests.support.settings import server_settings
from tests.support.waiting import wait_for

NOTE = "mcp://notes.example/vault"
OTHER = "langgraph://store/profile/tea"
QUERY = "where is the vault key kept"


async def test_a_uri_forgotten_on_one_replica_is_gone_from_the_others_searches(
    fresh_database_url: str, tmp_path: Path, namespace: str
) -> None:
    async with serving(
        [TranscriptComponent()], server_settings(), database_url=fresh_database_url
    ) as transcript_server:
        env = {
            "DATABASE_URL": fresh_database_url,
            "TRANSCRIPT_SERVICE_ADDR": transcript_server.address,
            "RUNIFOLD_MEMORY_INDEX": "pgvector",
            "RUNIFOLD_MEMORY_INDEXER_POLL_S": "0.05",
            "RUNIFOLD_DB_POOL_MIN": "1",
        }
        async with (
            service_process("services.memory", env, tmp_path / "a") as first,
            service_process("services.memory", env, tmp_path / "b") as second,
            grpc.aio.insecure_channel(transcript_server.address) as to_transcript,
            grpc.aio.insecure_channel(first.address) as to_first,
            grpc.aio.insecure_channel(second.address) as to_second,
        ):
            transcript = stubs.transcript(to_transcript)
            writer, reader = stubs.memory(to_first), stubs.memory(to_second)
            cid = (
                await transcript.CreateConversation(
                    transcript_pb.CreateConversationRequest(namespace=namespace)
                )
            ).conversation.conversation_id
            await transcript.AppendEntries(
                transcript_pb.AppendEntriesRequest(
                    namespace=namespace,
                    conversation_id=cid,
                    messages=[
                        common_pb2.Message(role=common_pb2.ROLE_USER, text="the key is upstairs")
                    ],
                )
            )

            async def remember(content: str, *sources: pb.MemorySource) -> str:
                made = await writer.UpsertMemory(
                    pb.UpsertMemoryRequest(namespace=namespace, content=content, sources=sources)
                )
                return made.memory.memory_id

            # At least one source, of one kind: none, an empty one, both kinds in one.
            for sources, expected, field in (
                ([], "NO_SOURCES", "sources"),
                ([pb.MemorySource()], "INVALID_CONVERSATION_ID", "sources[0].conversation_id"),
                (
                    [pb.MemorySource(conversation_id=cid, from_sequence=1, external_uri=NOTE)],
                    "INVALID_EXTERNAL_URI",
                    "sources[0].external_uri",
                ),
                (
                    [pb.MemorySource(external_uri="notes/42")],
                    "INVALID_EXTERNAL_URI",
                    "sources[0].external_uri",
                ),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await writer.UpsertMemory(
                        pb.UpsertMemoryRequest(
                            namespace=namespace, content="A fact.", sources=sources
                        )
                    )
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert reason(refused.value) == expected
                violations = status_detail(refused.value, error_details_pb2.BadRequest)
                assert [v.field for v in violations.field_violations] == [field]

            note = pb.MemorySource(external_uri=NOTE)
            forgotten = {
                await remember("The vault key is kept in the blue box.", note),
                await remember(
                    "The vault key is kept upstairs, in the blue box.",
                    note,
                    pb.MemorySource(conversation_id=cid, from_sequence=1, through_sequence=1),
                ),
            }
            kept = await remember(
                "The vault key is kept next to the tea.", pb.MemorySource(external_uri=OTHER)
            )
            index = PgvectorIndex(fresh_database_url, LOCAL_MODEL_NAME, LOCAL_MODEL_DIMENSION)
            await index.start()
            try:

                async def indexed_ids() -> set[str]:
                    return {str(m) for ns, m in await index.keys() if ns == namespace}

                async def all_indexed() -> bool:
                    return {*forgotten, kept} <= await indexed_ids()

                await wait_for(all_indexed, timeout=60)

                async def found(
                    mode: pb.SearchMode.ValueType = pb.SEARCH_MODE_UNSPECIFIED,
                ) -> set[str]:
                    reply = await reader.SearchMemories(
                        pb.SearchMemoriesRequest(
                            namespace=namespace, query=QUERY, limit=10, mode=mode
                        )
                    )
                    assert not reply.degraded
                    return {hit.memory.memory_id for hit in reply.results}

                assert await found() == {*forgotten, kept}
                reply = await writer.ForgetSource(
                    pb.ForgetSourceRequest(namespace=namespace, external_uri=NOTE)
                )
                assert reply.deleted_count == 2 and not reply.HasField("erasure")
                # At once on the other replica (its search re-reads PostgreSQL)...
                assert await found() == {kept}

                # ...and in the index itself, once the outbox drained (either replica's
                # indexer): no point of them is left for any search to find.
                async def index_caught_up() -> bool:
                    return not forgotten & await indexed_ids()

                await wait_for(index_caught_up, timeout=60)
                assert kept in await indexed_ids()
                for mode in (pb.SEARCH_MODE_DENSE, pb.SEARCH_MODE_LEXICAL, pb.SEARCH_MODE_HYBRID):
                    assert await found(mode) == {kept}
                listed = await reader.ListMemories(pb.ListMemoriesRequest(namespace=namespace))
                assert [m.memory_id for m in listed.memories] == [kept]
                assert [s.external_uri for s in listed.memories[0].sources] == [OTHER]
            finally:
                await index.close()
