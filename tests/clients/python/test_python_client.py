"""The Python client against scripted answers: its typed errors, the requests it builds,
gRPC's retries, and the blocking client as a thin form of the async one.

The answers come from real gRPC servers on loopback (the client is grpc.aio inside);
the error mapping alone is also driven over grpc_testing's channel with the
generated blocking stubs, as an application with its own stubs would use it.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import grpc_testing
import pytest
from google.protobuf import any_pb2, duration_pb2, message_factory
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold.transcript.v1 import transcript_service_pb2_grpc as transcript_grpc
from runifold_client import (
    AsyncClient,
    Client,
    ConcurrencyMode,
    ConversationBusy,
    ConversationContextPolicy,
    InvalidArgument,
    ModelOutputInvalid,
    NotFound,
    RevisionConflict,
    RunifoldError,
    SummaryRequired,
    TurnConflict,
    TurnQueueFull,
    Unavailable,
    VersionConflict,
    source,
)
from runifold_client.errors import from_rpc_error

MESSAGE = "scripted"
AGENT = agent_pb.DESCRIPTOR.services_by_name["AgentService"]
TRANSCRIPT = transcript_pb.DESCRIPTOR.services_by_name["TranscriptService"]
SUMMARY = summary_pb.DESCRIPTOR.services_by_name["SummaryService"]
MEMORY = memory_pb.DESCRIPTOR.services_by_name["MemoryService"]


def status_of(code: int, reason: str, metadata: dict[str, str], *details: Any) -> status_pb2.Status:
    """A google.rpc.Status with ErrorInfo first, as the servers send it."""
    packed = []
    for message in (
        error_details_pb2.ErrorInfo(reason=reason, domain="runifold.io", metadata=metadata),
        *details,
    ):
        item = any_pb2.Any()
        item.Pack(message)
        packed.append(item)
    return status_pb2.Status(code=code, message=MESSAGE, details=packed)


def fail(
    context: grpc.ServicerContext, code: int, reason: str, metadata: dict[str, str], *details: Any
) -> None:
    context.abort_with_status(rpc_status.to_status(status_of(code, reason, metadata, *details)))


class ScriptedServer:
    """A real gRPC server on loopback that answers every call of one method with
    `respond(request, context)` (a response, or `fail(...)`), keeping the requests."""

    def __init__(self, method: Any, respond: Callable[[Any, Any], Any]) -> None:
        self.requests: list[Any] = []
        request_type = message_factory.GetMessageClass(method.input_type)
        response_type = message_factory.GetMessageClass(method.output_type)

        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            self.requests.append(request)
            return respond(request, context)

        handler = grpc.unary_unary_rpc_method_handler(
            handle,
            request_deserializer=request_type.FromString,
            response_serializer=response_type.SerializeToString,
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    method.containing_service.full_name, {method.name: handler}
                ),
            )
        )
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.server.stop(None)


def scripted(
    method: Any, respond: Callable[[Any, Any], Any], call: Callable[[Client], Any]
) -> tuple[Any, list[Any]]:
    """Run `call` on a blocking client against a server that answers with `respond`;
    return what the call returned (or raised) and the requests the server received."""
    with (
        ScriptedServer(method, respond) as server,
        Client(server.address, namespace="tenant-a", timeout=5, max_attempts=1) as client,
    ):
        try:
            return call(client), server.requests
        except Exception as error:
            return error, server.requests


def test_turn_conflict_carries_the_outcome_and_current_version() -> None:
    detail = agent_pb.TurnConflict(
        outcome=agent_pb.TurnOutcome(
            output=[common_pb2.Message(role=common_pb2.ROLE_ASSISTANT, text="the answer")],
            usage=common_pb2.Usage(input_tokens=9, output_tokens=4, model_calls=1),
        ),
        current_version=5,
        expected_version=4,
    )

    def respond(request: Any, context: Any) -> None:
        fail(context, code_pb2.ABORTED, "TURN_CONFLICT", {"current_version": "5"}, detail)

    error, requests = scripted(
        AGENT.methods_by_name["RunConversation"],
        respond,
        lambda c: c.run_conversation("hi", conversation_id="c1"),
    )
    assert isinstance(error, TurnConflict)
    assert error.reason == "TURN_CONFLICT" and error.current_version == 5
    assert error.outcome.text == "the answer" and error.outcome.usage.output_tokens == 4
    assert requests[0].turn_id, "a turn id is always sent, so retries are idempotent"


def _failing_turn(code: int, reason: str, *details: Any) -> Any:
    def respond(request: Any, context: Any) -> None:
        fail(context, code, reason, {"running_turn_id": "t-0"}, *details)

    error, requests = scripted(
        AGENT.methods_by_name["RunConversation"],
        respond,
        lambda c: c.run_conversation(
            "hi", conversation_id="c1", concurrency=ConcurrencyMode.REJECT
        ),
    )
    assert requests[0].concurrency == agent_pb.CONCURRENCY_MODE_REJECT
    return error


def test_turn_errors_of_the_concurrency_modes_are_typed() -> None:
    busy = _failing_turn(code_pb2.ABORTED, "CONVERSATION_BUSY")
    assert isinstance(busy, ConversationBusy) and busy.running_turn_id == "t-0"
    assert busy.outcome.messages == []
    delay = duration_pb2.Duration(seconds=1, nanos=500_000_000)
    full = _failing_turn(
        code_pb2.RESOURCE_EXHAUSTED,
        "TURN_QUEUE_FULL",
        error_details_pb2.RetryInfo(retry_delay=delay),
    )
    assert isinstance(full, TurnQueueFull) and full.retry_delay == 1.5
    invalid = _failing_turn(
        code_pb2.FAILED_PRECONDITION,
        "MODEL_OUTPUT_INVALID",
        agent_pb.ModelOutputInvalid(
            outcome=agent_pb.TurnOutcome(
                output=[common_pb2.Message(role=common_pb2.ROLE_ASSISTANT, text="kept")]
            ),
            violations=["output[0].tool_calls: too many"],
        ),
    )
    assert isinstance(invalid, ModelOutputInvalid) and invalid.outcome.text == "kept"
    assert invalid.violations == ["output[0].tool_calls: too many"]


def test_summary_required_exposes_the_backlog() -> None:
    def respond(request: Any, context: Any) -> None:
        fail(
            context,
            code_pb2.FAILED_PRECONDITION,
            "SUMMARY_REQUIRED",
            {"backlog": "84", "job_id": "j1"},
        )

    policy = ConversationContextPolicy(window=16).with_semantic_memory(8)
    error, requests = scripted(
        AGENT.methods_by_name["RunConversation"],
        respond,
        lambda c: c.run_conversation("What did we decide?", conversation_id="c1", policy=policy),
    )
    assert isinstance(error, SummaryRequired) and error.backlog == 84 and error.job_id == "j1"
    assert requests[0].policy.window == 16 and requests[0].policy.memory_limit == 8


def test_version_conflict_has_the_current_version() -> None:
    def respond(request: Any, context: Any) -> None:
        fail(context, code_pb2.ABORTED, "VERSION_CONFLICT", {"current_version": "3"})

    error, _ = scripted(
        TRANSCRIPT.methods_by_name["AppendEntries"],
        respond,
        lambda c: c.append("c1", "hi", expected_version=1),
    )
    assert isinstance(error, VersionConflict) and error.current_version == 3


class FlakyTranscripts:
    """A real gRPC server on loopback whose AppendEntries and Summarize answer UNAVAILABLE
    `failures` times, then succeed (or answer `final` when given)."""

    def __init__(self, failures: int, final: grpc.StatusCode | None = None) -> None:
        self.failures = failures
        self.final = final
        self.requests: list[Any] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {
            "AppendEntries": grpc.unary_unary_rpc_method_handler(
                self._append,
                request_deserializer=transcript_pb.AppendEntriesRequest.FromString,
                response_serializer=transcript_pb.AppendEntriesResponse.SerializeToString,
            )
        }
        summary = {
            "Summarize": grpc.unary_unary_rpc_method_handler(
                self._summarize,
                request_deserializer=summary_pb.SummarizeRequest.FromString,
                response_serializer=summary_pb.SummarizeResponse.SerializeToString,
            )
        }
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(TRANSCRIPT.full_name, handlers),
                grpc.method_handlers_generic_handler(SUMMARY.full_name, summary),
            )
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _fail_first(self, request: Any, context: grpc.ServicerContext) -> None:
        self.requests.append(request)
        if len(self.requests) <= self.failures:
            context.abort(grpc.StatusCode.UNAVAILABLE, "down")
        if self.final is not None:
            context.abort(self.final, "refused")

    def _append(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._fail_first(request, context)
        return transcript_pb.AppendEntriesResponse(version=1, first_sequence=1, last_sequence=1)

    def _summarize(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._fail_first(request, context)
        return summary_pb.SummarizeResponse(passes=1)

    def client(self, **options: Any) -> Client:
        return Client(f"127.0.0.1:{self.port}", namespace="tenant-a", timeout=10, **options)

    def stop(self) -> None:
        self.server.stop(None)


@pytest.fixture
def flaky() -> Iterator[Callable[..., FlakyTranscripts]]:
    made: list[FlakyTranscripts] = []

    def make(failures: int, final: grpc.StatusCode | None = None) -> FlakyTranscripts:
        made.append(FlakyTranscripts(failures, final))
        return made[-1]

    yield make
    for server in made:
        server.stop()


def test_unavailable_is_retried_by_grpc_with_the_same_request_id(
    flaky: Callable[..., FlakyTranscripts],
) -> None:
    server = flaky(failures=2)
    with server.client(max_attempts=3) as client:
        reply = client.append(str(uuid.uuid4()), "hi")
    assert reply.version == 1
    assert len(server.requests) == 3
    ids = {request.request_id for request in server.requests}
    assert len(ids) == 1 and ids != {""}, "every attempt carries the same request id"


def test_retries_stop_at_max_attempts(flaky: Callable[..., FlakyTranscripts]) -> None:
    server = flaky(failures=5)
    with server.client(max_attempts=2) as client, pytest.raises(Unavailable):
        client.append(str(uuid.uuid4()), "hi")
    assert len(server.requests) == 2


def test_other_failures_are_not_retried(flaky: Callable[..., FlakyTranscripts]) -> None:
    server = flaky(failures=0, final=grpc.StatusCode.INVALID_ARGUMENT)
    with server.client() as client, pytest.raises(InvalidArgument):
        client.append(str(uuid.uuid4()), "hi")
    assert len(server.requests) == 1


def test_summarize_is_never_retried(flaky: Callable[..., FlakyTranscripts]) -> None:
    """Its passes would spend model calls again."""
    server = flaky(failures=1)
    with server.client(max_attempts=5) as client, pytest.raises(Unavailable):
        client.summarize(str(uuid.uuid4()), window=4, summary_batch=4)
    assert len(server.requests) == 1


def test_policy_helpers_validate() -> None:
    with pytest.raises(ValueError):
        ConversationContextPolicy().with_semantic_memory(0)
    auto = ConversationContextPolicy(window=8).with_auto_summary(3).to_proto()
    assert auto.summary_mode == agent_pb.SUMMARY_MODE_AUTO and auto.max_summary_passes == 3


def test_blocking_summarize_sends_the_window_and_passes() -> None:
    def respond(request: Any, context: Any) -> Any:
        return summary_pb.SummarizeResponse(passes=2, backlog=7)

    reply, requests = scripted(
        SUMMARY.methods_by_name["Summarize"],
        respond,
        lambda c: c.summarize("c1", window=8, max_summary_passes=2),
    )
    (request,) = requests
    assert (request.namespace, request.conversation_id) == ("tenant-a", "c1")
    assert (request.window, request.summary_batch, request.max_summary_passes) == (8, 64, 2)
    assert isinstance(reply, summary_pb.SummarizeResponse)
    assert (reply.passes, reply.backlog) == (2, 7)


def test_a_confirmed_proposal_sends_its_sources_unchanged() -> None:
    """The incarnation each proposed source names travels to UpsertMemory as it came
    (an int64 beyond 2**53 included), so the server can refuse an erased one."""
    incarnation = 2**62 + 12345
    proposal = memory_pb.MemoryProposal(
        content="The user lives in Lisbon.",
        sources=[source("c1", 2, 3, incarnation), source("c1", 5, 5, incarnation)],
        action=memory_pb.PROPOSAL_ACTION_ADD,
    )

    def respond(request: Any, context: Any) -> Any:
        return memory_pb.UpsertMemoryResponse(created=True)

    _, requests = scripted(
        MEMORY.methods_by_name["UpsertMemory"], respond, lambda c: c.confirm_proposal(proposal)
    )
    (request,) = requests
    assert list(request.sources) == list(proposal.sources)
    assert [s.incarnation for s in request.sources] == [incarnation] * 2


def test_blocking_delete_conversation_and_its_not_found() -> None:
    def deleted(request: Any, context: Any) -> Any:
        return transcript_pb.DeleteConversationResponse(deleted=True)

    reply, requests = scripted(
        TRANSCRIPT.methods_by_name["DeleteConversation"],
        deleted,
        lambda c: c.delete_conversation("c1"),
    )
    assert (requests[0].namespace, requests[0].conversation_id) == ("tenant-a", "c1")
    assert isinstance(reply, transcript_pb.DeleteConversationResponse) and reply.deleted

    def missing(request: Any, context: Any) -> None:
        fail(context, code_pb2.NOT_FOUND, "CONVERSATION_NOT_FOUND", {})

    error, requests = scripted(
        TRANSCRIPT.methods_by_name["DeleteConversation"],
        missing,
        lambda c: c.delete_conversation("c2", namespace="tenant-b"),
    )
    assert isinstance(error, NotFound) and error.reason == "CONVERSATION_NOT_FOUND"
    assert [r.namespace for r in requests] == ["tenant-b"]


def test_the_blocking_client_has_every_method_of_the_async_client() -> None:
    """One implementation: Client is AsyncClient's methods run to completion."""
    # AsyncClient is composed of one class of methods per service: walk them all.
    public = {
        name: member
        for name, member in inspect.getmembers(AsyncClient)
        if not name.startswith("_")
        and (inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member))
    }
    assert {"run_conversation", "list_memories", "acquire_turn_lease"} <= set(public)
    for name, method in public.items():
        if name == "close":
            continue
        blocking = getattr(Client, name)
        assert blocking.__wrapped__ is method, name
        assert blocking.__doc__ == method.__doc__, name


def test_every_rpc_of_the_four_services_has_a_client_method() -> None:
    # The source of AsyncClient and of the per-service classes it is composed of.
    source = "".join(inspect.getsource(part) for part in AsyncClient.__mro__ if part is not object)
    for service in (AGENT, TRANSCRIPT, SUMMARY, MEMORY):
        for method in service.methods:
            assert f".{method.name}," in source or f".{method.name}(" in source, method.name


def test_blocking_iterators_follow_the_pages() -> None:
    def respond(request: Any, context: Any) -> Any:
        if not request.page_token:
            return transcript_pb.ListEntriesResponse(
                entries=[common_pb2.Entry(sequence=1)], next_page_token="page-2"
            )
        return transcript_pb.ListEntriesResponse(entries=[common_pb2.Entry(sequence=2)])

    sequences, requests = scripted(
        TRANSCRIPT.methods_by_name["ListEntries"],
        respond,
        lambda c: [e.sequence for e in c.entries("c1", after_sequence=0)],
    )
    assert sequences == [1, 2]
    assert [r.page_token for r in requests] == ["", "page-2"]
    assert {r.namespace for r in requests} == {"tenant-a"}


def test_a_blocking_iterator_left_early_is_closed() -> None:
    def respond(request: Any, context: Any) -> Any:
        return transcript_pb.ListConversationsResponse(
            conversations=[transcript_pb.Conversation(conversation_id="a")],
            next_page_token="more",
        )

    first, requests = scripted(
        TRANSCRIPT.methods_by_name["ListConversations"],
        respond,
        lambda c: next(iter(c.list_conversations())).conversation_id,
    )
    assert first == "a" and len(requests) == 1


async def test_the_async_client_raises_the_same_typed_errors() -> None:
    def respond(request: Any, context: Any) -> None:
        fail(context, code_pb2.ABORTED, "REVISION_CONFLICT", {"current_revision": "4"})

    with ScriptedServer(MEMORY.methods_by_name["DeleteMemory"], respond) as server:
        async with AsyncClient(server.address, namespace="tenant-a", timeout=5) as client:
            with pytest.raises(RevisionConflict) as conflict:
                await client.delete_memory("m1", expected_revision=3)
    assert conflict.value.current_revision == 4
    (request,) = server.requests
    assert request.HasField("expected_revision") and request.expected_revision == 3


def test_invalid_argument_names_the_field() -> None:
    violation = error_details_pb2.BadRequest(
        field_violations=[error_details_pb2.BadRequest.FieldViolation(field="namespace")]
    )

    def respond(request: Any, context: Any) -> None:
        fail(context, code_pb2.INVALID_ARGUMENT, "INVALID_NAMESPACE", {}, violation)

    error, _ = scripted(
        TRANSCRIPT.methods_by_name["GetConversation"],
        respond,
        lambda c: c.get_conversation("c1", namespace=""),
    )
    assert isinstance(error, InvalidArgument) and error.field == "namespace"


def test_an_async_client_works_from_any_event_loop() -> None:
    """Made outside any loop, one AsyncClient serves one asyncio.run after another and
    threads with loops of their own, at once (a channel per loop); closed, it refuses."""

    def respond(request: Any, context: Any) -> Any:
        return summary_pb.GetBacklogResponse(depth=len(server.requests))

    with ScriptedServer(SUMMARY.methods_by_name["GetBacklog"], respond) as server:
        client = AsyncClient(server.address, namespace="tenant-a", timeout=5)
        assert asyncio.run(client.backlog()).depth == 1
        assert asyncio.run(client.backlog()).depth == 2
        barrier = threading.Barrier(3)
        depths: list[int] = []

        def elsewhere() -> None:
            barrier.wait()
            depths.append(asyncio.run(client.backlog()).depth)

        threads = [threading.Thread(target=elsewhere) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(depths) == [3, 4, 5]

        async def close_then_call() -> None:
            await client.backlog()
            await client.close()
            with pytest.raises(RuntimeError, match="closed"):
                await client.backlog()

        asyncio.run(close_then_call())


async def test_a_blocking_client_works_inside_a_running_event_loop() -> None:
    """It runs on a loop of its own: calling it from async code blocks, but never
    deadlocks on the caller's loop."""

    def respond(request: Any, context: Any) -> Any:
        return summary_pb.GetBacklogResponse(depth=3)

    with (
        ScriptedServer(SUMMARY.methods_by_name["GetBacklog"], respond) as server,
        Client(server.address, namespace="tenant-a", timeout=5) as client,
    ):
        assert asyncio.get_running_loop().is_running()
        assert client.backlog().depth == 3


def test_errors_of_your_own_blocking_stubs_map_the_same_way() -> None:
    """from_rpc_error over grpc_testing's scripted channel (no network)."""
    channel = grpc_testing.channel([TRANSCRIPT], grpc_testing.strict_real_time())
    stub = transcript_grpc.TranscriptServiceStub(channel)
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            stub.AppendEntries(transcript_pb.AppendEntriesRequest(conversation_id="c1"))
        except grpc.RpcError as error:
            outcome["error"] = from_rpc_error(error)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    _, _, rpc = channel.take_unary_unary(TRANSCRIPT.methods_by_name["AppendEntries"])
    status = status_of(code_pb2.ABORTED, "VERSION_CONFLICT", {"current_version": "7"})
    rpc.terminate(
        None,
        (("grpc-status-details-bin", status.SerializeToString()),),
        grpc.StatusCode.ABORTED,
        MESSAGE,
    )
    thread.join(10)
    error = outcome["error"]
    assert isinstance(error, VersionConflict) and isinstance(error, RunifoldError)
    assert error.current_version == 7 and error.message == MESSAGE


def test_a_source_is_a_transcript_range_or_an_external_uri() -> None:
    ranged = source("c1", 1, 3, 7)
    assert (ranged.conversation_id, ranged.from_sequence, ranged.through_sequence) == ("c1", 1, 3)
    assert ranged.incarnation == 7 and ranged.external_uri == ""
    external = source(external_uri="mcp://notes/42")
    assert external == memory_pb.MemorySource(external_uri="mcp://notes/42")
    with pytest.raises(ValueError):
        source("c1", 1, 3, external_uri="mcp://notes/42")


def test_a_client_given_nothing_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """RUNIFOLD_TARGET, RUNIFOLD_NAMESPACE and RUNIFOLD_TOKEN, as the `runifold` command
    reads them; what a client is given wins (an empty namespace or token is given)."""
    seen: list[tuple[str, tuple[str, ...]]] = []

    def respond(request: Any, context: Any) -> Any:
        bearer = tuple(v for k, v in context.invocation_metadata() if k == "authorization")
        seen.append((request.namespace, bearer))
        return summary_pb.GetBacklogResponse()

    with ScriptedServer(SUMMARY.methods_by_name["GetBacklog"], respond) as server:
        monkeypatch.setenv("RUNIFOLD_TARGET", server.address)
        monkeypatch.setenv("RUNIFOLD_NAMESPACE", "ns-from-env")
        monkeypatch.setenv("RUNIFOLD_TOKEN", "token-from-env")
        with Client(timeout=5) as client:
            assert client.aio.target == server.address
            client.backlog()
        with Client(namespace="given", token="", timeout=5) as client:
            client.backlog()

        async def from_async() -> None:
            async with AsyncClient(timeout=5) as client:
                await client.backlog()

        asyncio.run(from_async())
    assert seen == [
        ("ns-from-env", ("Bearer token-from-env",)),
        ("given", ()),
        ("ns-from-env", ("Bearer token-from-env",)),
    ]


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_call_that_reaches_no_server_says_where_it_tried_once() -> None:
    target = f"127.0.0.1:{closed_port()}"
    with Client(target, namespace="n", timeout=10, max_attempts=1) as client:
        with pytest.raises(Unavailable) as unavailable:
            client.backlog()
        # A watch, which resumes broken streams, says so too instead of retrying forever.
        with pytest.raises(Unavailable) as watching:
            next(iter(client.watch_conversation(str(uuid.uuid4()))))
    for error in (unavailable.value, watching.value):
        assert error.target == target and error.reason == "UNAVAILABLE"
        assert str(error).count(f"cannot reach {target}") == 1, str(error)
        assert str(error).startswith("UNAVAILABLE: cannot reach"), str(error)
