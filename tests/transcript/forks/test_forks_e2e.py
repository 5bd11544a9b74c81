"""ForkConversation through a real gRPC server on real PostgreSQL: the fork on the wire
(fork_origin), WatchConversation of a fork (its shared prefix, then its own entries,
each with the version of the append that wrote it, from any point), and the erasure of a
source with the watches of its forks open.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
import pytest

from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common.status import error_info
from tests.support.grpc_calls import user
from tests.transcript.watch.support import Follower, check_exactly_once_in_order, versions_of

if TYPE_CHECKING:
    from runifold.transcript.v1.transcript_service_pb2_grpc import (
        TranscriptServiceAsyncStub as Stub,
    )


async def _source(stub: Stub, namespace: str) -> str:
    """A conversation: v1 = 1..3, v2 = 4..5, v3 = 6."""
    reply = await stub.CreateConversation(pb.CreateConversationRequest(namespace=namespace))
    cid = reply.conversation.conversation_id
    for texts in (["s1", "s2", "s3"], ["s4", "s5"], ["s6"]):
        await _append(stub, namespace, cid, *texts)
    return cid


async def _append(stub: Stub, namespace: str, cid: str, *texts: str) -> pb.AppendEntriesResponse:
    return await stub.AppendEntries(
        pb.AppendEntriesRequest(
            namespace=namespace, conversation_id=cid, messages=[user(t) for t in texts]
        )
    )


async def _fork(
    stub: Stub, namespace: str, cid: str, through: int, **fields: str
) -> pb.Conversation:
    reply = await stub.ForkConversation(
        pb.ForkConversationRequest(
            namespace=namespace, conversation_id=cid, through_sequence=through, **fields
        )
    )
    return reply.conversation


def _watch(namespace: str, cid: str, after: int = 0) -> pb.WatchConversationRequest:
    return pb.WatchConversationRequest(
        namespace=namespace, conversation_id=cid, after_sequence=after
    )


async def test_a_fork_on_the_wire_and_its_watch(transcript: Stub, namespace: str) -> None:
    source = await _source(transcript, namespace)
    fork = await _fork(transcript, namespace, source, 4, request_id="regenerate-4")
    assert fork.fork_origin.conversation_id == source
    assert (fork.fork_origin.through_sequence, fork.version, fork.last_sequence) == (4, 2, 4)
    got = await transcript.GetConversation(
        pb.GetConversationRequest(namespace=namespace, conversation_id=fork.conversation_id)
    )
    assert got.conversation.fork_origin == fork.fork_origin
    again = await transcript.ForkConversation(
        pb.ForkConversationRequest(
            namespace=namespace,
            conversation_id=source,
            through_sequence=4,
            request_id="regenerate-4",
        )
    )
    assert not again.created and again.conversation.conversation_id == fork.conversation_id
    fid = fork.conversation_id

    follower = Follower(transcript, _watch(namespace, fid))
    try:
        await follower.until(lambda f: bool(f.heartbeats()))
        # The prefix: the source's first append whole (version 1), then the entry the
        # fork point cut from its second, which the fork (version 2) holds.
        versions = versions_of(follower)
        assert versions == {1: (1, 3), 2: (1, 3), 3: (1, 3), 4: (2, 4)}
        assert follower.texts() == ["s1", "s2", "s3", "s4"]
        assert follower.heartbeats()[0].version == 2
        # Live: the fork's own appends; the source's are not the fork's.
        await _append(transcript, namespace, source, "source only")
        ack = await _append(transcript, namespace, fid, "f5", "f6")
        await follower.until_sequence(6)
        check_exactly_once_in_order(follower.sequences(), 0, 6)
        assert follower.texts()[4:] == ["f5", "f6"]
        assert versions_of(follower)[6] == (ack.version, 6)
    finally:
        await follower.close()
    # Resumed inside the prefix: the rest of it, then the fork's own.
    resumed = Follower(transcript, _watch(namespace, fid, after=2))
    try:
        await resumed.until(lambda f: bool(f.heartbeats()))
        check_exactly_once_in_order(resumed.sequences(), 2, 6)
        assert resumed.texts() == ["s3", "s4", "f5", "f6"]
    finally:
        await resumed.close()

    with pytest.raises(grpc.aio.AioRpcError) as beyond:
        await _fork(transcript, namespace, source, 99)
    assert beyond.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info = error_info(beyond.value)
    assert info is not None and info.reason == "SEQUENCE_OUT_OF_RANGE"
    with pytest.raises(grpc.aio.AioRpcError) as elsewhere:
        await _fork(transcript, namespace + "-x", source, 1)
    assert elsewhere.value.code() == grpc.StatusCode.NOT_FOUND


async def test_erasing_a_source_ends_the_watches_of_its_forks(
    transcript: Stub, namespace: str
) -> None:
    source = await _source(transcript, namespace)
    fork = await _fork(transcript, namespace, source, 5)
    await _append(transcript, namespace, fork.conversation_id, "f6")
    fork_of_fork = await _fork(transcript, namespace, fork.conversation_id, 6)
    followers = [
        Follower(transcript, _watch(namespace, cid))
        for cid in (fork.conversation_id, fork_of_fork.conversation_id)
    ]
    try:
        for follower in followers:
            await follower.until(lambda f: bool(f.heartbeats()))
        await transcript.DeleteConversation(
            pb.DeleteConversationRequest(namespace=namespace, conversation_id=source)
        )
        for follower, conversation in zip(followers, (fork, fork_of_fork), strict=True):
            await follower.until_ended()
            assert follower.error is None, follower.error
            assert follower.kinds()[-1] == "erased"
            assert follower.events[-1].erased.incarnation == conversation.incarnation
        for conversation in (fork, fork_of_fork):
            with pytest.raises(grpc.aio.AioRpcError) as gone:
                await transcript.GetConversation(
                    pb.GetConversationRequest(
                        namespace=namespace, conversation_id=conversation.conversation_id
                    )
                )
            assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        for follower in followers:
            await follower.close()
