"""The Python client's error handling and retries against scripted responses (grpc_testing)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import grpc_testing
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.common.v1 import common_pb2
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client import (
    Client,
    ConcurrencyMode,
    ConversationBusy,
    ConversationContextPolicy,
    InvalidArgument,
    ModelOutputInvalid,
    NotFound,
    SummaryRequired,
    TurnConflict,
    TurnQueueFull,
    Unavailable,
    VersionConflict,
)

MESSAGE = "scripted"
AGENT = agent_pb.DESCRIPTOR.services_by_name["AgentService"]
TRANSCRIPT = transcript_pb.DESCRIPTOR.services_by_name["TranscriptService"]
SUMMARY = summary_pb.DESCRIPTOR.services_by_name["SummaryService"]


def status_metadata(
    code: int, reason: str, metadata: dict[str, str], *details: Any
) -> tuple[tuple[str, bytes], ...]:
    packed = []
    for message in (
        error_details_pb2.ErrorInfo(reason=reason, domain="runifold.io", metadata=metadata),
        *details,
    ):
        item = any_pb2.Any()
        item.Pack(message)
        packed.append(item)
    status = status_pb2.Status(code=code, message=MESSAGE, details=packed)
    return (("grpc-status-details-bin", status.SerializeToString()),)


def scripted(
    method: Any, respond: Callable[[Any, Any], None], call: Callable[[Client], Any], times: int = 1
) -> tuple[Any, list[Any]]:
    """Run `call` on a client over a grpc_testing channel; answer each RPC with `respond`."""
    channel = grpc_testing.channel([AGENT, TRANSCRIPT, SUMMARY], grpc_testing.strict_real_time())
    client = Client(channel=channel, namespace="tenant-a", timeout=5)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call(client)
        except Exception as error:
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    requests = []
    for _ in range(times):
        _, request, rpc = channel.take_unary_unary(method)
        requests.append(request)
        respond(request, rpc)
    thread.join(10)
    assert not thread.is_alive(), "the client is still waiting for an answer: a retry?"
    if "error" in outcome:
        return outcome["error"], requests
    return outcome.get("value"), requests


def test_turn_conflict_carries_the_outcome_and_current_version() -> None:
    detail = agent_pb.TurnConflict(
        outcome=agent_pb.TurnOutcome(
            output=[common_pb2.Message(role=common_pb2.ROLE_ASSISTANT, text="the answer")],
            usage=common_pb2.Usage(input_tokens=9, output_tokens=4, model_calls=1),
        ),
        current_version=5,
        expected_version=4,
    )

    def respond(request: Any, rpc: Any) -> None:
        rpc.terminate(
            None,
            status_metadata(code_pb2.ABORTED, "TURN_CONFLICT", {"current_version": "5"}, detail),
            grpc.StatusCode.ABORTED,
            MESSAGE,
        )

    error, requests = scripted(
        AGENT.methods_by_name["RunConversation"],
        respond,
        lambda c: c.run_conversation("hi", conversation_id="c1"),
    )
    assert isinstance(error, TurnConflict)
    assert error.reason == "TURN_CONFLICT" and error.current_version == 5
    assert error.outcome.text == "the answer" and error.outcome.usage.output_tokens == 4
    assert requests[0].turn_id, "a turn id is always sent, so retries are idempotent"


def _failing_turn(code: int, grpc_code: grpc.StatusCode, reason: str, *details: Any) -> Any:
    def respond(request: Any, rpc: Any) -> None:
        rpc.terminate(
            None,
            status_metadata(code, reason, {"running_turn_id": "t-0"}, *details),
            grpc_code,
            MESSAGE,
        )

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
    busy = _failing_turn(code_pb2.ABORTED, grpc.StatusCode.ABORTED, "CONVERSATION_BUSY")
    assert isinstance(busy, ConversationBusy) and busy.running_turn_id == "t-0"
    assert busy.outcome.messages == []
    delay = duration_pb2.Duration(seconds=1, nanos=500_000_000)
    full = _failing_turn(
        code_pb2.RESOURCE_EXHAUSTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "TURN_QUEUE_FULL",
        error_details_pb2.RetryInfo(retry_delay=delay),
    )
    assert isinstance(full, TurnQueueFull) and full.retry_delay == 1.5
    invalid = _failing_turn(
        code_pb2.FAILED_PRECONDITION,
        grpc.StatusCode.FAILED_PRECONDITION,
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
    def respond(request: Any, rpc: Any) -> None:
        rpc.terminate(
            None,
            status_metadata(
                code_pb2.FAILED_PRECONDITION, "SUMMARY_REQUIRED", {"backlog": "84", "job_id": "j1"}
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            MESSAGE,
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
    def respond(request: Any, rpc: Any) -> None:
        rpc.terminate(
            None,
            status_metadata(code_pb2.ABORTED, "VERSION_CONFLICT", {"current_version": "3"}),
            grpc.StatusCode.ABORTED,
            MESSAGE,
        )

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
    def respond(request: Any, rpc: Any) -> None:
        rpc.terminate(
            summary_pb.SummarizeResponse(passes=2, backlog=7),
            (),
            grpc.StatusCode.OK,
            "",
        )

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


def test_blocking_delete_conversation_and_its_not_found() -> None:
    def deleted(request: Any, rpc: Any) -> None:
        rpc.terminate(
            transcript_pb.DeleteConversationResponse(deleted=True), (), grpc.StatusCode.OK, ""
        )

    reply, requests = scripted(
        TRANSCRIPT.methods_by_name["DeleteConversation"],
        deleted,
        lambda c: c.delete_conversation("c1"),
    )
    assert (requests[0].namespace, requests[0].conversation_id) == ("tenant-a", "c1")
    assert isinstance(reply, transcript_pb.DeleteConversationResponse) and reply.deleted

    def missing(request: Any, rpc: Any) -> None:
        rpc.terminate(
            None,
            status_metadata(code_pb2.NOT_FOUND, "CONVERSATION_NOT_FOUND", {}),
            grpc.StatusCode.NOT_FOUND,
            MESSAGE,
        )

    error, requests = scripted(
        TRANSCRIPT.methods_by_name["DeleteConversation"],
        missing,
        lambda c: c.delete_conversation("c2", namespace="tenant-b"),
    )
    assert isinstance(error, NotFound) and error.reason == "CONVERSATION_NOT_FOUND"
    assert [r.namespace for r in requests] == ["tenant-b"]
