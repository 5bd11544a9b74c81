"""One tenant cannot slow down or knock over the others (issue 13, availability).

Real gRPC servers on 127.0.0.1:0, the real embedding model, real PostgreSQL:

- a flood of abandoned searches from one namespace (600 queries of 4,000
  characters, 2 s deadlines) leaves another namespace's search answering within
  3 s: with the default limits, and with admission off (then it is the embedding
  queue that drops the abandoned work and takes namespaces in turn);
- a full embedding queue answers OVERLOADED with a retry delay;
- a namespace at its turn limit is refused with RetryInfo while another namespace
  is served, its turns over the HTTP port counting against the same limit, and a
  turn waiting for its lease holds no slot;
- an oversized append or turn is refused by its count before any message is read,
  and a request above the transport cap by grpc itself;
- connections that never speak, or stay idle, are closed after the configured
  time; connections beyond the cap are closed at once.
"""

from __future__ import annotations

import asyncio
import random
import socket
import string
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from connectrpc.code import Code as ConnectCode
from connectrpc.errors import ConnectError
from google.rpc import error_details_pb2
from prometheus_client import REGISTRY

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.common import stubs
from services.common.server import serving
from services.common.status import error_info
from services.transcript.component import TranscriptComponent
from tests.memory.support import memory_config, memory_server, outbox_drained
from tests.support.fake_openai import FakeOpenAI
from tests.support.grpc_calls import reason, status_detail, user
from tests.support.http_calls import connect_call
from tests.support.http_calls import detail as http_detail
from tests.support.http_calls import error_info as http_error_info
from tests.support.settings import server_settings
from tests.support.stack import HTTP_ON, Stack, full_stack
from tests.support.waiting import wait_for

FLOOD = 600
QUERY_CHARS = 4000
SEARCH = ("runifold.memory.v1.MemoryService", "SearchMemories")


def long_query(rng: random.Random) -> str:
    """A query of about 4,000 characters of word-like text (the model reads 256 tokens)."""
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < QUERY_CHARS:
        words.append("".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))))
    return " ".join(words)[:QUERY_CHARS]


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def started(service: str, method: str) -> float:
    return sample(
        "grpc_server_started_total", grpc_type="unary", grpc_service=service, grpc_method=method
    )


def outcome(error: grpc.aio.AioRpcError | None) -> str:
    """OK, or the code and ErrorInfo reason of a failed call."""
    if error is None:
        return "OK"
    info = error_info(error)
    return f"{error.code().name}/{info.reason if info else ''}"


def retry_delay_s(error: grpc.aio.AioRpcError) -> float:
    delay = status_detail(error, error_details_pb2.RetryInfo).retry_delay
    return float(delay.seconds + delay.nanos / 1e9)


async def seed_memory(channel: grpc.aio.Channel, namespace: str, content: str) -> None:
    transcript, memory = stubs.transcript(channel), stubs.memory(channel)
    created = await transcript.CreateConversation(
        transcript_pb.CreateConversationRequest(namespace=namespace)
    )
    cid = created.conversation.conversation_id
    await transcript.AppendEntries(
        transcript_pb.AppendEntriesRequest(
            namespace=namespace, conversation_id=cid, expected_version=0, messages=[user(content)]
        )
    )
    await memory.UpsertMemory(
        memory_pb.UpsertMemoryRequest(
            namespace=namespace,
            content=content,
            sources=[
                memory_pb.MemorySource(conversation_id=cid, from_sequence=1, through_sequence=1)
            ],
        )
    )


async def flood_and_victim(
    channel: grpc.aio.Channel, flooder: str, victim: str
) -> tuple[Counter[str], memory_pb.SearchMemoriesResponse]:
    """600 long searches from `flooder` with 2 s deadlines, then, once the server has
    received every one of them, one search from `victim` with a 3 s deadline."""
    memory = stubs.memory(channel)
    rng = random.Random(13)
    queries = [long_query(rng) for _ in range(FLOOD)]

    async def flood_one(query: str) -> str:
        try:
            await memory.SearchMemories(
                memory_pb.SearchMemoriesRequest(namespace=flooder, query=query, limit=5),
                timeout=2,
            )
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                assert retry_delay_s(error) > 0, "a refusal says when to retry"
            return outcome(error)
        return outcome(None)

    before = started(*SEARCH)
    flood = [asyncio.ensure_future(flood_one(q)) for q in queries]

    async def all_received() -> bool:
        return started(*SEARCH) - before >= FLOOD

    await wait_for(all_received, timeout=30)
    # The bound of the issue ("within 3 s of the flood") as the victim's deadline.
    answer = await memory.SearchMemories(
        memory_pb.SearchMemoriesRequest(
            namespace=victim, query="where does the team deploy from?", limit=5
        ),
        timeout=3,
    )
    return Counter(await asyncio.gather(*flood)), answer


async def test_a_flood_of_abandoned_searches_leaves_another_namespace_answering(
    shared_database_url: str, tmp_path: Path, namespace: str
) -> None:
    flooder, victim = namespace + "-flood", namespace + "-victim"
    async with (
        memory_server(shared_database_url, memory_config(tmp_path / "index")) as (running, comp),
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        await seed_memory(channel, victim, "The team deploys from the Frankfurt cluster.")
        await wait_for(lambda: outbox_drained(comp))
        outcomes, answer = await flood_and_victim(channel, flooder, victim)
    assert [r.memory.content for r in answer.results] == [
        "The team deploys from the Frankfurt cluster."
    ]
    assert not answer.degraded
    # The flood is served up to its namespace's limit and refused beyond it at once.
    assert set(outcomes) <= {
        "OK",
        "DEADLINE_EXCEEDED/",
        "RESOURCE_EXHAUSTED/NAMESPACE_CONCURRENCY_LIMIT",
        "RESOURCE_EXHAUSTED/OVERLOADED",
    }, outcomes
    assert outcomes["RESOURCE_EXHAUSTED/NAMESPACE_CONCURRENCY_LIMIT"] > FLOOD // 2


async def test_the_embedding_queue_drops_abandoned_work_and_takes_namespaces_in_turn(
    shared_database_url: str, tmp_path: Path, namespace: str
) -> None:
    # No admission limit and room for the whole flood in the queue: what keeps the
    # victim's search quick is the queue itself.
    settings = server_settings(RUNIFOLD_NAMESPACE_MAX_SEARCHES="0")
    config = memory_config(tmp_path / "index", embeddings_max_queued=FLOOD * 2)
    flooder, victim = namespace + "-flood", namespace + "-victim"
    abandoned = sum(
        sample("runifold_work_abandoned_total", resource="embeddings", cause=cause)
        for cause in ("cancelled", "deadline")
    )
    async with (
        memory_server(shared_database_url, config, settings=settings) as (running, comp),
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        await seed_memory(channel, victim, "The team deploys from the Frankfurt cluster.")
        await wait_for(lambda: outbox_drained(comp))
        outcomes, answer = await flood_and_victim(channel, flooder, victim)
        embedder: Any = comp.embedder

        async def drained() -> bool:
            return bool(embedder.queued == 0)

        await wait_for(drained)
    assert [r.memory.content for r in answer.results] == [
        "The team deploys from the Frankfurt cluster."
    ]
    assert set(outcomes) <= {"OK", "DEADLINE_EXCEEDED/"}, outcomes
    dropped = (
        sum(
            sample("runifold_work_abandoned_total", resource="embeddings", cause=cause)
            for cause in ("cancelled", "deadline")
        )
        - abandoned
    )
    # Most callers had left before the model got to their query: their work was dropped.
    assert dropped > FLOOD // 2


async def test_a_full_embedding_queue_answers_overloaded_with_a_retry_delay(
    shared_database_url: str, tmp_path: Path, namespace: str
) -> None:
    settings = server_settings(RUNIFOLD_NAMESPACE_MAX_SEARCHES="0")
    config = memory_config(tmp_path / "index", embeddings_max_queued=4)
    shed = sample("runifold_requests_shed_total", resource="embeddings", reason="OVERLOADED")
    rng = random.Random(7)
    async with (
        memory_server(shared_database_url, config, settings=settings) as (running, _),
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        memory = stubs.memory(channel)

        async def search() -> grpc.aio.AioRpcError | None:
            try:
                await memory.SearchMemories(
                    memory_pb.SearchMemoriesRequest(
                        namespace=namespace, query=long_query(rng), limit=5
                    ),
                    timeout=60,
                )
            except grpc.aio.AioRpcError as error:
                return error
            return None

        results = await asyncio.gather(*(search() for _ in range(40)))
    refused = [e for e in results if e is not None]
    assert {outcome(e) for e in refused} == {"RESOURCE_EXHAUSTED/OVERLOADED"}
    assert 0 < len(refused) < 40, "the queue took what it could and refused the rest"
    for error in refused:
        info = error_info(error)
        assert info is not None and dict(info.metadata) == {"resource": "embeddings"}
        assert retry_delay_s(error) > 0
    assert sample(
        "runifold_requests_shed_total", resource="embeddings", reason="OVERLOADED"
    ) - shed == len(refused)


# -- per-namespace admission of turns --------------------------------------------------------


class HeldModel:
    """Answers each chat request once the test releases its last user text."""

    def __init__(self, model: FakeOpenAI) -> None:
        self.model = model
        self.releases: dict[str, asyncio.Event] = {}
        model.respond_with(self._respond)

    def release(self, text: str) -> asyncio.Event:
        return self.releases.setdefault(text, asyncio.Event())

    async def _respond(self, body: Any) -> str:
        text = body["messages"][-1]["content"]
        await asyncio.wait_for(self.release(text).wait(), 30)  # bounded: a stuck test fails
        return f"answer to {text}"

    def asked(self, text: str) -> bool:
        return any(r.messages[-1]["content"] == text for r in self.model.chat_requests)

    def open_all(self) -> None:
        for event in self.releases.values():
            event.set()


TURN_LIMIT = 2


@pytest.fixture(scope="module")
async def stack(
    shared_database_url: str, model: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with full_stack(
        shared_database_url,
        tmp_path_factory.mktemp("admission"),
        model,
        settings={"RUNIFOLD_NAMESPACE_MAX_TURNS": str(TURN_LIMIT)},
        http=HTTP_ON,
    ) as running:
        yield running


@pytest.fixture
def held(model: FakeOpenAI) -> Iterator[HeldModel]:
    model.requests.clear()
    holder = HeldModel(model)
    yield holder
    holder.open_all()


async def conversation(stack: Stack, namespace: str) -> str:
    created = await stack.transcript.CreateConversation(
        transcript_pb.CreateConversationRequest(namespace=namespace)
    )
    return created.conversation.conversation_id


def turn(
    namespace: str, cid: str, text: str, mode: int = agent_pb.CONCURRENCY_MODE_RACE
) -> agent_pb.RunConversationRequest:
    return agent_pb.RunConversationRequest(
        namespace=namespace,
        conversation_id=cid,
        input=[user(text)],
        turn_id=f"turn-{uuid.uuid4().hex}",
        concurrency=mode,  # type: ignore[arg-type]
    )


def asked(held: HeldModel, text: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return held.asked(text)

    return check


async def test_a_namespace_at_its_turn_limit_is_refused_while_another_is_served(
    stack: Stack, held: HeldModel, namespace: str
) -> None:
    other = namespace + "-other"
    shed = sample(
        "runifold_requests_shed_total", resource="turn", reason="NAMESPACE_CONCURRENCY_LIMIT"
    )
    running = []
    for text in ("a1", "a2"):
        cid = await conversation(stack, namespace)
        running.append(
            asyncio.ensure_future(stack.agent.RunConversation(turn(namespace, cid, text)))
        )
        await wait_for(asked(held, text))
    # At its limit: one more turn of the namespace is refused before any work...
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.agent.RunConversation(
            turn(namespace, await conversation(stack, namespace), "a3")
        )
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert reason(refused.value) == "NAMESPACE_CONCURRENCY_LIMIT"
    info = error_info(refused.value)
    assert info is not None and dict(info.metadata) == {"kind": "turn", "limit": "2"}
    assert retry_delay_s(refused.value) > 0
    assert not held.asked("a3")
    # ...the stream of a turn too (one kind: the namespace's turns)...
    stream = stack.agent.StreamConversation(
        agent_pb.StreamConversationRequest(
            namespace=namespace,
            conversation_id=await conversation(stack, namespace),
            input=[user("a4")],
        )
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused_stream:
        async for _ in stream:
            pass
    assert reason(refused_stream.value) == "NAMESPACE_CONCURRENCY_LIMIT"
    assert (
        sample(
            "runifold_requests_shed_total", resource="turn", reason="NAMESPACE_CONCURRENCY_LIMIT"
        )
        - shed
        == 2
    )
    # ...while another namespace is served at once.
    cid = await conversation(stack, other)
    served = asyncio.ensure_future(stack.agent.RunConversation(turn(other, cid, "b1")))
    await wait_for(asked(held, "b1"))
    held.release("b1").set()
    assert (await served).outcome.output[0].text == "answer to b1"
    held.open_all()
    for task in running:
        assert (await task).conversation_version == 1
    # Below its limit again, the namespace is served.
    held.release("a5").set()
    again = await stack.agent.RunConversation(
        turn(namespace, await conversation(stack, namespace), "a5")
    )
    assert again.outcome.output[0].text == "answer to a5"


async def test_a_namespace_s_turn_limit_counts_its_turns_on_both_ports(
    stack: Stack, held: HeldModel, namespace: str
) -> None:
    """One turn in flight over gRPC and one over the HTTP port fill the namespace's two
    slots: a third is refused on either port, with the same ErrorInfo and RetryInfo."""
    turn_method = agent_pb.DESCRIPTOR.services_by_name["AgentService"].methods_by_name[
        "RunConversation"
    ]
    over_grpc = asyncio.ensure_future(
        stack.agent.RunConversation(turn(namespace, await conversation(stack, namespace), "g1"))
    )
    await wait_for(asked(held, "g1"))
    over_http = asyncio.ensure_future(
        connect_call(
            stack.http_url, turn_method, turn(namespace, await conversation(stack, namespace), "h1")
        )
    )
    await wait_for(asked(held, "h1"))
    with pytest.raises(ConnectError) as refused_http:
        await connect_call(
            stack.http_url, turn_method, turn(namespace, await conversation(stack, namespace), "h2")
        )
    with pytest.raises(grpc.aio.AioRpcError) as refused_grpc:
        await stack.agent.RunConversation(
            turn(namespace, await conversation(stack, namespace), "g2")
        )
    assert refused_http.value.code is ConnectCode.RESOURCE_EXHAUSTED
    assert http_error_info(refused_http.value) == error_info(refused_grpc.value)
    assert reason(refused_grpc.value) == "NAMESPACE_CONCURRENCY_LIMIT"
    retry = http_detail(refused_http.value, error_details_pb2.RetryInfo)
    assert retry is not None and retry.retry_delay.ToTimedelta().total_seconds() > 0
    assert not held.asked("h2") and not held.asked("g2")
    held.open_all()
    assert (await over_grpc).conversation_version == 1
    assert (await over_http)[0].conversation_version == 1  # type: ignore[attr-defined]


async def test_a_turn_waiting_for_its_lease_holds_no_admission_slot(
    stack: Stack, held: HeldModel, namespace: str
) -> None:
    enqueue = agent_pb.CONCURRENCY_MODE_ENQUEUE
    held.release("two").set()  # answered as soon as it gets its lease
    busy = await conversation(stack, namespace)
    first = asyncio.ensure_future(
        stack.agent.RunConversation(turn(namespace, busy, "one", enqueue))
    )
    await wait_for(asked(held, "one"))
    # Behind it on the same conversation: this turn waits for the lease (minutes, maybe).
    stream = stack.agent.StreamConversation(
        agent_pb.StreamConversationRequest(
            namespace=namespace, conversation_id=busy, input=[user("two")], concurrency=enqueue
        )
    )
    events = stream.__aiter__()
    while not (event := await anext(events)).HasField("progress") or (
        event.progress.stage != agent_pb.TURN_STAGE_WAITING
    ):
        pass
    # Two turns in flight, one of them waiting: another conversation's turn is admitted.
    cid = await conversation(stack, namespace)
    third = asyncio.ensure_future(stack.agent.RunConversation(turn(namespace, cid, "three")))
    await wait_for(asked(held, "three"))
    # Now two turns work (one, three): the namespace is at its limit.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.agent.RunConversation(
            turn(namespace, await conversation(stack, namespace), "four")
        )
    assert reason(refused.value) == "NAMESPACE_CONCURRENCY_LIMIT"
    held.open_all()
    assert (await first).conversation_version == 1
    results = [e async for e in events if e.HasField("result")]
    assert [r.result.conversation_version for r in results] == [2]
    assert (await third).conversation_version == 1


# -- counts before conversion, the transport cap ------------------------------------------


def unspecified_role() -> common_pb2.Message:
    """A message the conversion refuses (INVALID_ROLE): seen only if it is converted."""
    return common_pb2.Message(role=common_pb2.ROLE_UNSPECIFIED, text="x")


async def test_an_oversized_append_is_refused_by_its_count_before_any_message_is_read(
    stack: Stack, namespace: str
) -> None:
    cid = await conversation(stack, namespace)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.transcript.AppendEntries(
            transcript_pb.AppendEntriesRequest(
                namespace=namespace,
                conversation_id=cid,
                messages=[unspecified_role()] + [user("m")] * 16_000,
            )
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason(refused.value) == "TOO_MANY_MESSAGES"
    info = error_info(refused.value)
    assert info is not None and info.metadata["limit"] == "256"


async def test_an_oversized_turn_is_refused_by_its_count_before_any_message_is_read(
    stack: Stack, namespace: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stack.agent.RunConversation(
            agent_pb.RunConversationRequest(
                namespace=namespace,
                conversation_id=await conversation(stack, namespace),
                input=[unspecified_role()] + [user("m")] * 1000,
            )
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason(refused.value) == "TOO_MANY_MESSAGES"


async def test_a_request_above_the_transport_cap_is_refused_by_grpc(
    shared_database_url: str, namespace: str
) -> None:
    async with (
        serving(
            [TranscriptComponent()], server_settings(), database_url=shared_database_url
        ) as running,
        grpc.aio.insecure_channel(
            running.address, options=[("grpc.max_send_message_length", 64 << 20)]
        ) as channel,
    ):
        transcript = stubs.transcript(channel)
        created = await transcript.CreateConversation(
            transcript_pb.CreateConversationRequest(namespace=namespace)
        )
        # 5 MB: above the largest append the limits allow (4 MiB and its framing).
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await transcript.AppendEntries(
                transcript_pb.AppendEntriesRequest(
                    namespace=namespace,
                    conversation_id=created.conversation.conversation_id,
                    messages=[user("y" * (200 * 1024)) for _ in range(25)],
                )
            )
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_info(refused.value) is None, "grpc refused it, before our code read it"


# -- connections -------------------------------------------------------------------------


PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the server closed the connection (what it sent before is read and dropped)."""
    try:
        while data := sock.recv(65536):
            del data
    except BlockingIOError:
        return False
    except ConnectionError:
        return True
    return True


@contextmanager
def sockets(address: str, count: int, send: bytes = b"") -> Iterator[list[socket.socket]]:
    host, _, port = address.rpartition(":")
    opened = []
    try:
        for _ in range(count):
            sock = socket.create_connection((host, int(port)))
            if send:
                sock.sendall(send)
            sock.setblocking(False)
            opened.append(sock)
        yield opened
    finally:
        for sock in opened:
            sock.close()


async def test_connections_that_never_speak_or_stay_idle_are_closed(
    shared_database_url: str,
) -> None:
    settings = server_settings(RUNIFOLD_HANDSHAKE_TIMEOUT_S="1", RUNIFOLD_MAX_CONNECTION_IDLE_S="1")
    async with serving(
        [TranscriptComponent()], settings, database_url=shared_database_url
    ) as running:
        with (
            sockets(running.address, 200) as silent,
            sockets(running.address, 20, send=PREFACE) as idle,
        ):

            async def all_closed() -> bool:
                return all([closed_by_peer(s) for s in silent + idle])

            await wait_for(all_closed, timeout=30, interval=0.2)


async def test_connections_beyond_the_cap_are_closed_at_once(shared_database_url: str) -> None:
    settings = server_settings(RUNIFOLD_MAX_CONNECTIONS="8", RUNIFOLD_HANDSHAKE_TIMEOUT_S="120")
    async with serving(
        [TranscriptComponent()], settings, database_url=shared_database_url
    ) as running:
        with sockets(running.address, 12) as opened:

            async def beyond_cap_closed() -> bool:
                return sum(closed_by_peer(s) for s in opened) >= 4

            await wait_for(beyond_cap_closed)
            assert sum(closed_by_peer(s) for s in opened) == 4, "the first 8 stay open"
        # Once they are gone, a client is served again (the server sees them close
        # when its transport reads the end of each stream: soon, not at once).

        async def served_again() -> bool:
            async with grpc.aio.insecure_channel(running.address) as channel:
                try:
                    await stubs.transcript(channel).CreateConversation(
                        transcript_pb.CreateConversationRequest(namespace="cap-ns"), timeout=10
                    )
                except grpc.aio.AioRpcError as error:
                    if error.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
                    return False
                return True

        await wait_for(served_again)
