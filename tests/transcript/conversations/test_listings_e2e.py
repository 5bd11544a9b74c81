"""The listings a person reads first, through a real server, over gRPC and HTTP JSON:
ListNamespaces answers only the namespaces the caller's identity grants (every one for
a "*" grant, or with authentication off), and ListConversations newest first with each
conversation's preview."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc
import pytest

from runifold.common.v1 import common_pb2
from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs
from services.common.auth import AuthSettings
from services.common.http.settings import HttpSettings
from services.common.server import RunningServer, serving
from services.transcript.component import TranscriptComponent
from tests.support.grpc_calls import Metadata, authorization, jwt_token, user
from tests.support.http_calls import post_json
from tests.support.settings import server_settings

if TYPE_CHECKING:
    from runifold.transcript.v1.transcript_service_pb2_grpc import TranscriptServiceAsyncStub

SECRET = "listings-suite-secret-" + "s" * 32
TRANSCRIPT = "runifold.transcript.v1.TranscriptService"


@pytest.fixture(scope="module")
async def guarded(shared_database_url: str) -> AsyncIterator[RunningServer]:
    async with serving(
        [TranscriptComponent()],
        server_settings(),
        database_url=shared_database_url,
        auth=AuthSettings(mode="jwt", jwt_secret=SECRET, jwt_audience="runifold"),
        http=HttpSettings(listen_address="127.0.0.1:0"),
    ) as running:
        yield running


async def _all_pages(stub: TranscriptServiceAsyncStub, metadata: Metadata) -> list[str]:
    names: list[str] = []
    token = ""
    while True:
        page = await stub.ListNamespaces(
            pb.ListNamespacesRequest(page_size=50, page_token=token), metadata=metadata
        )
        names += page.namespaces
        token = page.next_page_token
        if not token:
            return names


async def test_a_caller_lists_only_the_namespaces_it_is_granted(
    guarded: RunningServer, namespace: str
) -> None:
    held = [f"{namespace}-{name}" for name in ("a", "b", "c")]
    async with grpc.aio.insecure_channel(guarded.address) as channel:
        transcript = stubs.transcript(channel)
        for name in held:
            await transcript.CreateConversation(
                pb.CreateConversationRequest(namespace=name),
                metadata=authorization(jwt_token(SECRET, name)),
            )
        # Granted a and c (and one without conversations): a and c, never b.
        mine = authorization(jwt_token(SECRET, held[0], held[2], f"{namespace}-empty"))
        assert await _all_pages(transcript, mine) == [held[0], held[2]]
        # "*": every namespace with conversations, b too.
        everything = await _all_pages(transcript, authorization(jwt_token(SECRET, "*")))
        assert [n for n in everything if n.startswith(namespace)] == held
        assert everything == sorted(everything)
        # A token is the listing of its grants: another identity's is refused.
        first = await transcript.ListNamespaces(
            pb.ListNamespacesRequest(page_size=1), metadata=authorization(jwt_token(SECRET, "*"))
        )
        with pytest.raises(grpc.aio.AioRpcError) as moved:
            await transcript.ListNamespaces(
                pb.ListNamespacesRequest(page_token=first.next_page_token), metadata=mine
            )
        assert moved.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as anonymous:
            await transcript.ListNamespaces(pb.ListNamespacesRequest())
        assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # Over HTTP JSON, the same answer (what the console calls).
    assert guarded.http is not None
    reply = await post_json(guarded.http.url, f"{TRANSCRIPT}/ListNamespaces", {}, dict(mine))
    assert reply.status == 200 and reply.body["namespaces"] == [held[0], held[2]]


async def test_without_authentication_every_namespace_is_listed(
    transcript_server: RunningServer, namespace: str
) -> None:
    async with grpc.aio.insecure_channel(transcript_server.address) as channel:
        transcript = stubs.transcript(channel)
        await transcript.CreateConversation(pb.CreateConversationRequest(namespace=namespace))
        assert namespace in await _all_pages(transcript, ())


async def test_conversations_newest_first_with_their_previews_over_json(
    guarded: RunningServer, namespace: str
) -> None:
    """The console's call: proto3 JSON names, the order by its enum name."""
    assert guarded.http is not None
    token = dict(authorization(jwt_token(SECRET, namespace)))
    made = []
    async with grpc.aio.insecure_channel(guarded.address) as channel:
        transcript = stubs.transcript(channel)
        for i in range(3):
            cid = str(uuid.uuid4())
            made.append(cid)
            await transcript.CreateConversation(
                pb.CreateConversationRequest(namespace=namespace, conversation_id=cid),
                metadata=tuple(token.items()),
            )
            await transcript.AppendEntries(
                pb.AppendEntriesRequest(
                    namespace=namespace,
                    conversation_id=cid,
                    messages=[
                        user(f"<b>question {i}</b>"),
                        common_pb2.Message(role=common_pb2.ROLE_ASSISTANT, text="answer"),
                    ],
                ),
                metadata=tuple(token.items()),
            )
    reply = await post_json(
        guarded.http.url,
        f"{TRANSCRIPT}/ListConversations",
        {"namespace": namespace, "order": "CONVERSATION_ORDER_NEWEST_FIRST", "pageSize": 2},
        token,
    )
    assert reply.status == 200, reply.body
    listed = reply.body["conversations"]
    assert [c["conversationId"] for c in listed] == made[::-1][:2]
    assert [c["preview"] for c in listed] == ["<b>question 2</b>", "<b>question 1</b>"]
    rest = await post_json(
        guarded.http.url,
        f"{TRANSCRIPT}/ListConversations",
        {
            "namespace": namespace,
            "order": "CONVERSATION_ORDER_NEWEST_FIRST",
            "pageToken": reply.body["nextPageToken"],
        },
        token,
    )
    assert [c["conversationId"] for c in rest.body["conversations"]] == [made[0]]


async def test_the_python_client_lists_namespaces_and_conversations_newest_first(
    guarded: RunningServer, namespace: str
) -> None:
    from runifold_client import AsyncClient

    token = jwt_token(SECRET, namespace, f"{namespace}-none")
    async with AsyncClient(guarded.address, namespace=namespace, token=token) as client:
        made = [(await client.create_conversation()).conversation_id for _ in range(3)]
        for i, cid in enumerate(made):
            await client.append(cid, [f"question {i}"])
        assert [n async for n in client.list_namespaces(page_size=1)] == [namespace]
        newest = [c async for c in client.list_conversations(newest_first=True, page_size=2)]
        assert [c.conversation_id for c in newest] == made[::-1]
        assert [c.preview for c in newest] == ["question 2", "question 1", "question 0"]
        oldest = [c.conversation_id async for c in client.list_conversations()]
        assert oldest == sorted(made)
