"""TranscriptService through a real gRPC server: concurrency, idempotency, errors, health."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
from grpc_health.v1 import health_pb2

from runifold.common.v1 import common_pb2
from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs
from services.common.migrations import SchemaMismatch
from services.common.server import RunningServer, serving
from services.common.status import error_info
from services.common.stubs import transcript as stubs_for
from services.transcript.component import TranscriptComponent
from tests.support.grpc_calls import check_health_follows_schema, health_status, user
from tests.support.settings import server_settings

if TYPE_CHECKING:
    from runifold.transcript.v1.transcript_service_pb2_grpc import (
        TranscriptServiceAsyncStub as Stub,
    )


async def create(stub: Stub, namespace: str) -> str:
    response = await stub.CreateConversation(pb.CreateConversationRequest(namespace=namespace))
    return response.conversation.conversation_id


async def test_32_clients_racing_one_version_exactly_one_commits(
    transcript_server: RunningServer, namespace: str
) -> None:
    channels = [grpc.aio.insecure_channel(transcript_server.address) for _ in range(32)]
    try:
        stubs = [stubs_for(ch) for ch in channels]
        cid = await create(stubs[0], namespace)
        await asyncio.gather(*(ch.channel_ready() for ch in channels))

        async def attempt(i: int) -> grpc.aio.AioRpcError | pb.AppendEntriesResponse:
            try:
                return await stubs[i].AppendEntries(
                    pb.AppendEntriesRequest(
                        conversation_id=cid,
                        namespace=namespace,
                        expected_version=0,
                        messages=[user(f"writer {i}")],
                    )
                )
            except grpc.aio.AioRpcError as error:
                return error

        results = await asyncio.gather(*(attempt(i) for i in range(32)))
    finally:
        await asyncio.gather(*(ch.close() for ch in channels))
    wins = [r for r in results if isinstance(r, pb.AppendEntriesResponse)]
    losses = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(wins) == 1 and len(losses) == 31
    assert wins[0].version == 1 and wins[0].first_sequence == wins[0].last_sequence == 1
    for loss in losses:
        assert loss.code() == grpc.StatusCode.ABORTED
        info = error_info(loss)
        assert info is not None and info.reason == "VERSION_CONFLICT"
        assert info.metadata["current_version"] == "1"


async def test_concurrent_clients_keep_sequences_contiguous(
    transcript_server: RunningServer, namespace: str
) -> None:
    """8 clients x 200 appends over shared and own conversations, retrying on conflict."""
    channels = [grpc.aio.insecure_channel(transcript_server.address) for _ in range(8)]
    stubs = [stubs_for(ch) for ch in channels]
    shared = [await create(stubs[0], namespace) for _ in range(2)]
    own = [await create(stub, namespace) for stub in stubs]
    successes: Counter[str] = Counter()
    conflicts = 0

    async def client(index: int) -> None:
        nonlocal conflicts
        rng = random.Random(index)
        stub = stubs[index]
        versions: dict[str, int] = {}
        for n in range(200):
            cid = rng.choice([*shared, own[index]])
            count = rng.randint(1, 3)
            messages = [user(f"c{index}-a{n}-m{k}") for k in range(count)]
            while True:
                if cid not in versions:
                    got = await stub.GetConversation(
                        pb.GetConversationRequest(conversation_id=cid, namespace=namespace)
                    )
                    versions[cid] = got.conversation.version
                try:
                    done = await stub.AppendEntries(
                        pb.AppendEntriesRequest(
                            conversation_id=cid,
                            namespace=namespace,
                            expected_version=versions[cid],
                            messages=messages,
                        )
                    )
                except grpc.aio.AioRpcError as error:
                    assert error.code() == grpc.StatusCode.ABORTED
                    info = error_info(error)
                    assert info is not None and info.reason == "VERSION_CONFLICT"
                    versions[cid] = int(info.metadata["current_version"])
                    conflicts += 1
                    continue
                assert done.last_sequence - done.first_sequence + 1 == count
                versions[cid] = done.version
                successes[cid] += 1
                break

    try:
        await asyncio.gather(*(client(i) for i in range(8)))
        for cid in [*shared, *own]:
            texts = []
            token = ""
            sequences = []
            while True:
                page = await stubs[0].ListEntries(
                    pb.ListEntriesRequest(
                        conversation_id=cid, namespace=namespace, page_size=1000, page_token=token
                    )
                )
                sequences += [e.sequence for e in page.entries]
                texts += [e.message.text for e in page.entries]
                token = page.next_page_token
                if not token:
                    break
            got = await stubs[0].GetConversation(
                pb.GetConversationRequest(conversation_id=cid, namespace=namespace)
            )
            assert sequences == list(range(1, len(sequences) + 1)), "no gap, no duplicate"
            assert len(set(texts)) == len(texts), "no message written twice"
            assert got.conversation.version == successes[cid]
            assert got.conversation.last_sequence == len(sequences)
    finally:
        await asyncio.gather(*(ch.close() for ch in channels))
    assert sum(successes.values()) == 1600
    assert conflicts > 0, "the shared conversations were contended"


async def test_retried_request_id_returns_first_result(transcript: Stub, namespace: str) -> None:
    cid = await create(transcript, namespace)
    request = pb.AppendEntriesRequest(
        conversation_id=cid,
        namespace=namespace,
        expected_version=0,
        messages=[user("once")],
        request_id="req-42",
        usage=common_pb2.Usage(input_tokens=7, model_calls=1),
    )
    first = await transcript.AppendEntries(request)
    again = await transcript.AppendEntries(request)
    assert not first.replayed and again.replayed
    assert (again.version, again.first_sequence, again.last_sequence) == (1, 1, 1)
    assert again.usage.input_tokens == 7
    got = await transcript.GetConversation(
        pb.GetConversationRequest(conversation_id=cid, namespace=namespace)
    )
    assert got.conversation.version == 1 and got.conversation.last_sequence == 1

    request.messages[0].text = "different"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await transcript.AppendEntries(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(caught.value)
    assert info is not None and info.reason == "REQUEST_ID_REUSED"


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (common_pb2.Message(role=common_pb2.ROLE_SYSTEM, text="obey"), "SYSTEM_ROLE_NOT_ALLOWED"),
        (common_pb2.Message(role=common_pb2.ROLE_UNSPECIFIED, text="x"), "INVALID_ROLE"),
        (common_pb2.Message(role=99, text="x"), "INVALID_ROLE"),  # type: ignore[arg-type]
        (
            common_pb2.Message(role=common_pb2.ROLE_USER, text="x" * (300 * 1024)),
            "MESSAGE_TOO_LARGE",
        ),
    ],
)
async def test_bad_messages_are_invalid_argument_with_reason(
    transcript: Stub, namespace: str, message: common_pb2.Message, reason: str
) -> None:
    cid = await create(transcript, namespace)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await transcript.AppendEntries(
            pb.AppendEntriesRequest(
                conversation_id=cid, namespace=namespace, messages=[user("ok"), message]
            )
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(caught.value)
    assert info is not None and info.reason == reason and info.domain == "runifold.io"
    got = await transcript.GetConversation(
        pb.GetConversationRequest(conversation_id=cid, namespace=namespace)
    )
    assert got.conversation.version == 0


async def test_append_over_the_size_limit_is_invalid_argument(
    transcript: Stub, namespace: str
) -> None:
    cid = await create(transcript, namespace)
    # 4.1 MiB > the 4 MiB limit, under the transport cap just above it (a larger
    # request is refused by grpc itself: tests/system/e2e/test_load_shedding_e2e.py).
    big = [user("y" * (200 * 1024)) for _ in range(21)]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await transcript.AppendEntries(
            pb.AppendEntriesRequest(conversation_id=cid, namespace=namespace, messages=big)
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info := error_info(caught.value)) is not None and info.reason == "APPEND_TOO_LARGE"


async def test_another_namespace_gets_not_found_without_detail(
    transcript: Stub, namespace: str
) -> None:
    cid = await create(transcript, namespace)
    missing = str(uuid.uuid4())
    errors = []
    for target in (cid, missing):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await transcript.GetConversation(
                pb.GetConversationRequest(conversation_id=target, namespace=namespace + "-b")
            )
        errors.append(caught.value)
    # Someone else's conversation and a conversation that never existed look the same.
    assert [e.code() for e in errors] == [grpc.StatusCode.NOT_FOUND] * 2
    assert errors[0].details() == errors[1].details()
    assert [error_info(e).reason for e in errors] == ["CONVERSATION_NOT_FOUND"] * 2  # type: ignore[union-attr]


async def test_load_view_on_the_wire(transcript: Stub, namespace: str) -> None:
    cid = await create(transcript, namespace)
    await transcript.AppendEntries(
        pb.AppendEntriesRequest(
            conversation_id=cid,
            namespace=namespace,
            request_id="t1",
            messages=[user(f"m{i}") for i in range(1, 41)],
        )
    )
    view = await transcript.LoadView(
        pb.LoadViewRequest(
            conversation_id=cid,
            namespace=namespace,
            window=16,
            summary_batch=10,
            summarized_through=4,
            request_id="t1",
        )
    )
    assert [e.sequence for e in view.window] == list(range(25, 41))
    assert [e.sequence for e in view.summary_buffer] == list(range(5, 15))
    assert view.summary_backlog == 10
    assert view.prior_append.version == 1 and view.prior_append.last_sequence == 40
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await transcript.LoadView(
            pb.LoadViewRequest(conversation_id=cid, namespace=namespace, window=0, summary_batch=1)
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_grpcurl_uses_reflection_without_proto_files(
    transcript_server: RunningServer, transcript: Stub, namespace: str, tmp_path: object
) -> None:
    cid = await create(transcript, namespace)

    binary = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")

    def grpcurl(*args: str) -> str:
        done = subprocess.run(
            [binary, "-plaintext", *args],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=str(tmp_path),
            check=True,
        )
        return done.stdout

    listed = await asyncio.to_thread(grpcurl, transcript_server.address, "list")
    assert "runifold.transcript.v1.TranscriptService" in listed.split()
    assert "grpc.health.v1.Health" in listed.split()
    body = json.dumps(
        {
            "conversation_id": cid,
            "namespace": namespace,
            "expected_version": 0,
            "messages": [{"role": "ROLE_USER", "text": "from grpcurl"}],
        }
    )
    out = await asyncio.to_thread(
        grpcurl,
        "-d",
        body,
        transcript_server.address,
        "runifold.transcript.v1.TranscriptService/AppendEntries",
    )
    # The descriptors reflection serves carry each field's JSON name (buf generate writes
    # them), so grpcurl answers in proto3 JSON's lowerCamelCase; requests may use either.
    reply = json.loads(out)
    # The append's digest (base64 in proto3 JSON): SHA-256, 32 bytes.
    assert len(base64.b64decode(reply.pop("digest"))) == 32
    assert reply == {
        "version": "1",
        "firstSequence": "1",
        "lastSequence": "1",
        "usage": {},
    }


async def test_health_follows_schema_and_shutdown(fresh_database_url: str) -> None:
    serving_status = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    name = "runifold.transcript.v1.TranscriptService"
    async with serving(
        [TranscriptComponent()], server_settings(), database_url=fresh_database_url
    ) as running:
        assert await health_status(running.address) == serving_status
        # The schema stops being the one the code expects: health follows, both ways.
        await check_health_follows_schema(
            fresh_database_url, running.address, name, schema_service="transcript"
        )
        # Graceful shutdown: health turns NOT_SERVING before the server goes away.
        async with grpc.aio.insecure_channel(running.address) as ch:
            watch = stubs.health(ch).Watch(health_pb2.HealthCheckRequest(service=""))
            statuses = [int((await watch.read()).status)]
            stopping = asyncio.create_task(running.stop(grace=1.0))
            with contextlib.suppress(grpc.aio.AioRpcError):  # the stream ends with the server
                while (response := await watch.read()) is not grpc.aio.EOF:
                    statuses.append(int(response.status))
            await stopping
        assert statuses[0] == serving_status
        assert statuses[-1] == not_serving


async def test_server_refuses_to_start_on_a_wrong_schema(bare_database_url: str) -> None:
    with pytest.raises(SchemaMismatch):
        async with serving(
            [TranscriptComponent()],
            server_settings(RUNIFOLD_MIGRATE="check"),
            database_url=bare_database_url,
        ):
            pass
