"""The Python client's error handling and retries against scripted responses (grpc_testing)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
import grpc_testing
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.common.v1 import common_pb2
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client import (
    Client,
    ConversationContextPolicy,
    InvalidArgument,
    NotFound,
    SummaryRequired,
    TurnConflict,
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


def test_unavailable_is_retried_with_the_same_request_id() -> None:
    answers = iter([grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OK])

    def respond(request: Any, rpc: Any) -> None:
        code = next(answers)
        if code == grpc.StatusCode.OK:
            rpc.terminate(
                transcript_pb.AppendEntriesResponse(version=1, first_sequence=1, last_sequence=1),
                (),
                code,
                "",
            )
        else:
            rpc.terminate(None, (), code, "down")

    value, requests = scripted(
        TRANSCRIPT.methods_by_name["AppendEntries"],
        respond,
        lambda c: c.append("c1", "hi"),
        times=2,
    )
    assert value.version == 1
    assert requests[0].request_id and requests[0].request_id == requests[1].request_id


def test_other_failures_are_not_retried() -> None:
    def respond(request: Any, rpc: Any) -> None:
        rpc.terminate(
            None,
            status_metadata(code_pb2.INVALID_ARGUMENT, "SYSTEM_ROLE_NOT_ALLOWED", {}),
            grpc.StatusCode.INVALID_ARGUMENT,
            MESSAGE,
        )

    error, requests = scripted(
        TRANSCRIPT.methods_by_name["AppendEntries"], respond, lambda c: c.append("c1", "hi")
    )
    # One scripted answer only: a retry would leave the client waiting (see scripted).
    assert isinstance(error, InvalidArgument) and error.reason == "SYSTEM_ROLE_NOT_ALLOWED"
    assert requests[0].conversation_id == "c1" and requests[0].request_id


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
