"""Every JSON field a client sends, through a real server, over gRPC and over the HTTP
port: a document PostgreSQL's jsonb would refuse (a lone surrogate escape, \\u0000, a
number beyond numeric, nesting beyond RUNIFOLD_MAX_JSON_DEPTH) is INVALID_ARGUMENT
with the field's reason and the field named, writes nothing, and none of its text
reaches the server's log (issue 27: it was INTERNAL, HTTP 500, and the driver's
CONTEXT quoted the document in the log). Documents jsonb takes, on the same edges,
are stored.

The fields: CreateConversation's `state.{conversation,user,namespace}_json`,
AppendEntries' `state_delta.*_json` and `messages[].native_json`, ReleaseTurnLease's
`ended.output[].native_json`, RunConversation's `input[].native_json` and
`tools[].parameters_json_schema`. `ToolCall.arguments_json` is not among them: the
model's output passed through, kept as text (docs/transcript.md).
"""

from __future__ import annotations

import io
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import error_details_pb2

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.common.v1 import common_pb2
from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import jsonb, status
from tests.support.grpc_calls import status_detail, user
from tests.support.http_calls import post_json
from tests.support.stack import HTTP_ON, Stack, full_stack

# What no log may hold: it is in every refused document.
SECRET = "card-4111-1111-1111-1111"
DEEP = jsonb.MAX_DEPTH  # an array this deep inside the object: one level too many
REFUSED = {
    "lone_high_surrogate": '"\\ud800"',
    "lone_low_surrogate": '"\\udc00"',
    "number_above_numeric": "1e1000000",
    "number_below_numeric": "-1e1000000",
    "nested_too_deep": "[" * DEEP + "]" * DEEP,
    "nul_escape": '"\\u0000"',
}
ACCEPTED = {
    "surrogate_pair": '"\\ud83d\\ude00"',
    "large_number": "1e300",
    "long_integer": "9" * 5000,  # beyond Python's 4300-digit int conversion
    "small_number": "-1.5e-300",
    "deepest": "[" * (DEEP - 1) + "]" * (DEEP - 1),
    "escapes_look_alike": '"\\\\u0000 \\\\ud800"',  # an escaped backslash, then text
}
USER = "user-1"


def document(value: str) -> str:
    return f'{{"card": "{SECRET}", "value": {value}}}'


@pytest.fixture(scope="module")
async def stack(
    shared_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    """Every service, the agent on the offline model, with the HTTP port."""
    async with full_stack(
        shared_database_url, tmp_path_factory.mktemp("json-rules"), None, http=HTTP_ON
    ) as running:
        yield running


@dataclass(frozen=True)
class Refusal:
    code: str  # the gRPC code's name
    reason: str
    field: str


async def call(stack: Stack, transport: str, method: str, request: Message) -> Refusal | None:
    """One unary call over gRPC or HTTP JSON; None when it succeeded."""
    service = request.DESCRIPTOR.file.package + "." + method.split("/")[0]
    name = method.split("/")[1]
    if transport == "http":
        reply = await post_json(
            stack.http_url, f"{service}/{name}", json_format.MessageToDict(request)
        )
        if reply.status == 200:
            return None
        info = reply.error_info
        assert info is not None, reply.body
        fields = reply.field_violations
        return Refusal(str(reply.body["code"]).upper(), info.reason, fields[0] if fields else "")
    stub = stack.agent if service.startswith("runifold.agent") else stack.transcript
    try:
        await getattr(stub, name)(request, timeout=30)
    except grpc.aio.AioRpcError as error:
        info = status.error_info(error)
        field = ""
        if error.code() == grpc.StatusCode.INVALID_ARGUMENT:
            field = status_detail(error, error_details_pb2.BadRequest).field_violations[0].field
        return Refusal(error.code().name, info.reason if info else "", field)
    return None


@dataclass
class World:
    """A conversation of a user, and what its writes could change."""

    stack: Stack
    namespace: str
    conversation_id: str

    async def snapshot(self) -> tuple[Any, ...]:
        conversation = await self.stack.transcript.GetConversation(
            pb.GetConversationRequest(
                namespace=self.namespace, conversation_id=self.conversation_id
            )
        )
        state = await self.stack.transcript.GetState(
            pb.GetStateRequest(namespace=self.namespace, user_ids=[USER])
        )
        return (
            conversation.conversation.version,
            conversation.conversation.state_json,
            state.namespace_state.version,
            [s.version for s in state.user_states],
        )

    async def created(self, conversation_id: str) -> bool:
        try:
            await self.stack.transcript.GetConversation(
                pb.GetConversationRequest(namespace=self.namespace, conversation_id=conversation_id)
            )
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.NOT_FOUND
            return False
        return True


# A field: how to send a document in it (method and request), its reason and its name.
Send = Callable[[World, str], Awaitable[tuple[str, Message]]]


def _create(scope: str) -> Send:
    async def send(world: World, text: str) -> tuple[str, Message]:
        return "TranscriptService/CreateConversation", pb.CreateConversationRequest(
            namespace=world.namespace,
            conversation_id=str(uuid.uuid4()),
            user_id=USER,
            state=pb.StateDelta(**{f"{scope}_json": text}),
        )

    return send


def _append_state(scope: str) -> Send:
    async def send(world: World, text: str) -> tuple[str, Message]:
        return "TranscriptService/AppendEntries", pb.AppendEntriesRequest(
            namespace=world.namespace,
            conversation_id=world.conversation_id,
            messages=[user("hello")],
            state_delta=pb.StateDelta(**{f"{scope}_json": text}),
        )

    return send


async def _append_native(world: World, text: str) -> tuple[str, Message]:
    message = common_pb2.Message(role=common_pb2.ROLE_USER, text="hello", native_json=text)
    return "TranscriptService/AppendEntries", pb.AppendEntriesRequest(
        namespace=world.namespace, conversation_id=world.conversation_id, messages=[message]
    )


async def _release_outcome(world: World, text: str) -> tuple[str, Message]:
    turn_id = str(uuid.uuid4())
    acquired = await world.stack.transcript.AcquireTurnLease(
        pb.AcquireTurnLeaseRequest(
            namespace=world.namespace, conversation_id=world.conversation_id, turn_id=turn_id
        )
    )
    output = common_pb2.Message(role=common_pb2.ROLE_ASSISTANT, text="done", native_json=text)
    return "TranscriptService/ReleaseTurnLease", pb.ReleaseTurnLeaseRequest(
        namespace=world.namespace,
        conversation_id=world.conversation_id,
        turn_id=turn_id,
        fencing_token=acquired.lease.fencing_token,
        ended=pb.EndedTurn(output=[output], reason="MODEL_FAILED"),
    )


async def _turn_native(world: World, text: str) -> tuple[str, Message]:
    message = common_pb2.Message(role=common_pb2.ROLE_USER, text="hello", native_json=text)
    return "AgentService/RunConversation", agent_pb.RunConversationRequest(
        namespace=world.namespace, conversation_id=world.conversation_id, input=[message]
    )


async def _turn_tools(world: World, text: str) -> tuple[str, Message]:
    tool = common_pb2.ToolDefinition(name="lookup", parameters_json_schema=text)
    return "AgentService/RunConversation", agent_pb.RunConversationRequest(
        namespace=world.namespace,
        conversation_id=world.conversation_id,
        input=[user("hello")],
        tools=[tool],
    )


FIELDS: dict[str, tuple[Send, str, str]] = {
    "create_conversation": (_create("conversation"), "INVALID_STATE", "state.conversation_json"),
    "create_user": (_create("user"), "INVALID_STATE", "state.user_json"),
    "create_namespace": (_create("namespace"), "INVALID_STATE", "state.namespace_json"),
    "append_conversation": (
        _append_state("conversation"),
        "INVALID_STATE",
        "state_delta.conversation_json",
    ),
    "append_user": (_append_state("user"), "INVALID_STATE", "state_delta.user_json"),
    "append_namespace": (
        _append_state("namespace"),
        "INVALID_STATE",
        "state_delta.namespace_json",
    ),
    "append_native": (_append_native, "INVALID_NATIVE_JSON", "messages[0].native_json"),
    "release_outcome": (
        _release_outcome,
        "INVALID_NATIVE_JSON",
        "ended.output[0].native_json",
    ),
    "turn_native": (_turn_native, "INVALID_NATIVE_JSON", "input[0].native_json"),
    "turn_tools": (_turn_tools, "INVALID_TOOLS", "tools[0].parameters_json_schema"),
}


@pytest.fixture
async def world(stack: Stack, namespace: str) -> World:
    created = await stack.transcript.CreateConversation(
        pb.CreateConversationRequest(namespace=namespace, user_id=USER)
    )
    return World(stack, namespace, created.conversation.conversation_id)


@pytest.mark.parametrize("transport", ["grpc", "http"])
@pytest.mark.parametrize("field", FIELDS)
async def test_a_document_jsonb_refuses_is_invalid_argument_naming_the_field(
    world: World, captured: io.StringIO, field: str, transport: str
) -> None:
    send, expected_reason, expected_field = FIELDS[field]
    outcomes: dict[str, tuple[Refusal | None, bool]] = {}
    for case, value in REFUSED.items():
        before = await world.snapshot()
        method, request = await send(world, document(value))
        refusal = await call(world.stack, transport, method, request)
        unchanged = await world.snapshot() == before
        if isinstance(request, pb.CreateConversationRequest):
            unchanged = unchanged and not await world.created(request.conversation_id)
        if isinstance(request, pb.ReleaseTurnLeaseRequest):  # the lease is still held
            released = await world.stack.transcript.ReleaseTurnLease(
                pb.ReleaseTurnLeaseRequest(
                    namespace=world.namespace,
                    conversation_id=world.conversation_id,
                    turn_id=request.turn_id,
                    fencing_token=request.fencing_token,
                )
            )
            unchanged = unchanged and released.released
        outcomes[case] = (refusal, unchanged)
    logged = captured.getvalue()
    assert SECRET not in logged
    assert '"level": "ERROR"' not in logged  # nothing unhandled
    refused = Refusal("INVALID_ARGUMENT", expected_reason, expected_field)
    assert outcomes == dict.fromkeys(REFUSED, (refused, True))


@pytest.mark.parametrize("field", FIELDS)
async def test_documents_on_the_edge_that_jsonb_takes_are_accepted(
    world: World, captured: io.StringIO, field: str
) -> None:
    send = FIELDS[field][0]
    for case, value in ACCEPTED.items():
        method, request = await send(world, document(value))
        assert await call(world.stack, "grpc", method, request) is None, case
    assert SECRET not in captured.getvalue()


@pytest.mark.parametrize("transport", ["grpc", "http"])
async def test_a_kept_outcome_holding_nul_is_invalid_outcome(
    world: World, captured: io.StringIO, transport: str
) -> None:
    """A kept outcome may break the transcript's rules (a MODEL_OUTPUT_INVALID reply),
    but PostgreSQL cannot store a NUL: refused naming the field, the lease still held."""
    method, request = await _release_outcome(world, "")
    assert isinstance(request, pb.ReleaseTurnLeaseRequest)
    request.ended.output[0].text = f"{SECRET}\x00"
    refusal = await call(world.stack, transport, method, request)
    assert refusal == Refusal("INVALID_ARGUMENT", "INVALID_OUTCOME", "ended.output[0].text")
    released = await world.stack.transcript.ReleaseTurnLease(
        pb.ReleaseTurnLeaseRequest(
            namespace=world.namespace,
            conversation_id=world.conversation_id,
            turn_id=request.turn_id,
            fencing_token=request.fencing_token,
        )
    )
    assert released.released
    assert SECRET not in captured.getvalue()
