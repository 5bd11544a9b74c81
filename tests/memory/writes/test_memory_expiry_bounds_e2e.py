"""UpsertMemory with an expiry outside what a timestamp or a clock can hold is
INVALID_ARGUMENT / INVALID_EXPIRY, and writes nothing (found by
tests/system/security/test_hostile_input.py: these were INTERNAL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as pb
from runifold.transcript.v1 import transcript_service_pb2 as tpb
from services.common import stubs
from services.common.status import error_info
from tests.memory.support import HashEmbedder, memory_config, memory_server

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


async def test_out_of_range_expiry_is_invalid_argument(
    shared_database_url: str, tmp_path: Path, namespace: str
) -> None:
    config = memory_config(tmp_path)
    async with (
        memory_server(shared_database_url, config, embedder=HashEmbedder()) as (running, _),
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        transcript, memory = stubs.transcript(channel), stubs.memory(channel)
        created = await transcript.CreateConversation(
            tpb.CreateConversationRequest(namespace=namespace)
        )
        cid = created.conversation.conversation_id
        await transcript.AppendEntries(
            tpb.AppendEntriesRequest(
                namespace=namespace,
                conversation_id=cid,
                messages=[common_pb2.Message(role=common_pb2.ROLE_USER, text="hello")],
            )
        )
        source = pb.MemorySource(conversation_id=cid, from_sequence=1, through_sequence=1)
        cases: list[dict[str, Any]] = [
            {"expire_time": Timestamp(seconds=INT64_MAX)},  # beyond year 9999
            {"expire_time": Timestamp(seconds=INT64_MIN)},
            {"expire_time": Timestamp(seconds=2_000_000_000, nanos=-1)},
            {"expire_time": Timestamp(seconds=2_000_000_000, nanos=1_000_000_000)},
            {"ttl": Duration(seconds=INT64_MAX)},  # beyond what a timedelta holds
            {"ttl": Duration(seconds=INT64_MIN)},
            {"ttl": Duration(seconds=315_576_000_000)},  # valid, but ends after year 9999
            {"ttl": Duration(seconds=5, nanos=-1)},  # signs disagree
        ]
        for fields in cases:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await memory.UpsertMemory(
                    pb.UpsertMemoryRequest(
                        namespace=namespace, content="A fact.", sources=[source], **fields
                    )
                )
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, fields
            assert error_info(caught.value).reason == "INVALID_EXPIRY", fields  # type: ignore[union-attr]
        listed = await memory.ListMemories(pb.ListMemoriesRequest(namespace=namespace))
        assert list(listed.memories) == []
        # The far end of the range still works.
        kept = await memory.UpsertMemory(
            pb.UpsertMemoryRequest(
                namespace=namespace,
                content="A lasting fact.",
                sources=[source],
                expire_time=Timestamp(seconds=253402300799),  # 9999-12-31T23:59:59Z
            )
        )
        assert kept.memory.expire_time.seconds == 253402300799
