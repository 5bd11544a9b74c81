"""Tracing: server and client spans across a peer call, W3C propagation, no content.

A relay service (test-only) receives one RPC and makes two outbound calls to
TranscriptService through `services.common.channels.Peer`, the way the agent
does. With an in-memory exporter every span must share one trace id, each
child must point at its parent, and no attribute may carry the namespace or
the message text. The JSON access log must carry the same trace id.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from runifold.common.v1 import common_pb2
from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs, tracing
from services.common.channels import Peer, open_channel, outbound_metadata
from services.common.logs import JsonFormatter
from services.common.server import StartContext, serving
from services.transcript.component import TranscriptComponent
from tests.support.settings import server_settings
from tests.support.waiting import wait_for

RELAY = "/runifold.test.Relay/Relay"
SECRET_TEXT = "the launch code is 0000-secret"


class RelayComponent:
    """Answers Relay by creating a conversation and appending to it through a Peer."""

    name = "relay"
    service_names = ("runifold.test.Relay",)

    def __init__(self) -> None:
        self.peer: Peer | None = None

    def register(self, server: grpc.aio.Server) -> None:
        handler = grpc.unary_unary_rpc_method_handler(
            self.relay,
            request_deserializer=pb.AppendEntriesRequest.FromString,
            response_serializer=pb.AppendEntriesResponse.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("runifold.test.Relay", {"Relay": handler}),)
        )

    async def start(self, ctx: StartContext) -> None:
        self.peer = Peer("transcript", open_channel(ctx.self_address))

    async def stop(self) -> None:
        if self.peer is not None:
            await self.peer.close()

    async def healthy(self) -> bool:
        return True

    async def relay(self, request: pb.AppendEntriesRequest, context: Any) -> Any:
        assert self.peer is not None
        stub = stubs.transcript(self.peer.channel)
        created = await self.peer.call(
            stub.CreateConversation, pb.CreateConversationRequest(namespace=request.namespace)
        )
        request.conversation_id = created.conversation.conversation_id
        return await self.peer.call(stub.AppendEntries, request)


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing.install(provider)
    try:
        yield memory
    finally:
        tracing.shutdown()


class _Lines(logging.Handler):
    """Formats each access-log record at emit time (the request context is live then)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(JsonFormatter("test"))
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))

    def has(self, count: int) -> Callable[[], Awaitable[bool]]:
        """A predicate for wait_for: `count` access lines were written (a server writes
        its line once the call has ended, which may be after its caller has the answer)."""

        async def written() -> bool:
            return sum(1 for line in self.lines if line["message"] == "rpc") >= count

        return written


@pytest.fixture
def access_log() -> Iterator[_Lines]:
    logger = logging.getLogger("runifold.rpc")
    handler, level = _Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)  # the access lines of answered calls are DEBUG
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture
async def relay_address(shared_database_url: str) -> AsyncIterator[str]:
    async with serving(
        [TranscriptComponent(), RelayComponent()],
        server_settings(),
        database_url=shared_database_url,
        extras={"all_in_one": True},
    ) as running:
        yield running.address


async def call_relay(address: str, namespace: str, metadata: tuple[Any, ...] = ()) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        relay = channel.unary_unary(
            RELAY,
            request_serializer=pb.AppendEntriesRequest.SerializeToString,
            response_deserializer=pb.AppendEntriesResponse.FromString,
        )
        message = common_pb2.Message(role=common_pb2.ROLE_USER, text=SECRET_TEXT)
        await relay(
            pb.AppendEntriesRequest(namespace=namespace, expected_version=0, messages=[message]),
            metadata=metadata,
            timeout=10,
        )


RELAY_SERVER = ("runifold.test.Relay/Relay", SpanKind.SERVER)


async def finished_with(
    exporter: InMemorySpanExporter, *wanted: tuple[str, SpanKind]
) -> tuple[ReadableSpan, ...]:
    """The finished spans once each `wanted` (name, kind) is among them: a server span
    ends in the interceptor after its status went out, so a client may have its answer
    before the span is recorded."""

    async def ended() -> bool:
        done = {(s.name, s.kind) for s in exporter.get_finished_spans()}
        return all(w in done for w in wanted)

    await wait_for(ended)
    return exporter.get_finished_spans()


def by_name(spans: tuple[ReadableSpan, ...], name: str, kind: SpanKind) -> ReadableSpan:
    found = [s for s in spans if s.name == name and s.kind == kind]
    assert len(found) == 1, [(s.name, s.kind) for s in spans]
    return found[0]


async def test_peer_call_yields_parent_and_child_spans_in_one_trace(
    exporter: InMemorySpanExporter, access_log: _Lines, relay_address: str, namespace: str
) -> None:
    await call_relay(relay_address, namespace)

    append = "runifold.transcript.v1.TranscriptService/AppendEntries"
    spans = await finished_with(exporter, RELAY_SERVER, (append, SpanKind.SERVER))
    relay = by_name(spans, "runifold.test.Relay/Relay", SpanKind.SERVER)
    client = by_name(spans, append, SpanKind.CLIENT)
    server = by_name(spans, append, SpanKind.SERVER)
    create_client = by_name(
        spans, "runifold.transcript.v1.TranscriptService/CreateConversation", SpanKind.CLIENT
    )

    assert relay.parent is None  # the test client sent no trace context
    trace_id = relay.context.trace_id
    assert {s.context.trace_id for s in spans} == {trace_id}
    assert client.parent is not None and client.parent.span_id == relay.context.span_id
    assert create_client.parent is not None
    assert create_client.parent.span_id == relay.context.span_id
    assert server.parent is not None and server.parent.span_id == client.context.span_id
    assert server.parent.is_remote  # it came through gRPC metadata

    assert server.attributes is not None
    assert server.attributes["rpc.system"] == "grpc"
    assert server.attributes["rpc.method"] == "AppendEntries"
    assert server.attributes["rpc.grpc.status_code"] == 0
    for span in spans:
        for value in (span.attributes or {}).values():
            assert SECRET_TEXT not in str(value)
            assert namespace not in str(value)
        assert SECRET_TEXT not in span.name and namespace not in span.name

    # The access log of every RPC of the trace carries its trace id.
    rpc_lines = [line for line in access_log.lines if line["message"] == "rpc"]
    assert len(rpc_lines) == 3
    for line in rpc_lines:
        assert line["trace_id"] == format(trace_id, "032x")
        assert line["grpc_code"] == "OK"
        assert {"call_id", "grpc_service", "grpc_method", "duration_ms"} <= line.keys()
        assert SECRET_TEXT not in json.dumps(line)


async def test_inbound_traceparent_is_the_parent(
    exporter: InMemorySpanExporter, relay_address: str, namespace: str
) -> None:
    trace_id, span_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    await call_relay(relay_address, namespace, (("traceparent", f"00-{trace_id}-{span_id}-01"),))

    spans = await finished_with(exporter, RELAY_SERVER)
    relay = by_name(spans, "runifold.test.Relay/Relay", SpanKind.SERVER)
    assert relay.parent is not None and format(relay.parent.span_id, "016x") == span_id
    assert {format(s.context.trace_id, "032x") for s in spans} == {trace_id}


async def relay_call_id(address: str, namespace: str, metadata: tuple[Any, ...]) -> str:
    """Call the relay; the call id its trailers carry back."""
    async with grpc.aio.insecure_channel(address) as channel:
        relay = channel.unary_unary(
            RELAY,
            request_serializer=pb.AppendEntriesRequest.SerializeToString,
            response_deserializer=pb.AppendEntriesResponse.FromString,
        )
        message = common_pb2.Message(role=common_pb2.ROLE_USER, text="hello")
        call = relay(
            pb.AppendEntriesRequest(namespace=namespace, expected_version=0, messages=[message]),
            metadata=metadata,
            timeout=10,
        )
        await call
        trailers = dict(await call.trailing_metadata() or ())
    assert "x-request-id" not in trailers
    return str(trailers["x-call-id"])


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        ((("x-call-id", "call-1"),), "call-1"),
        # A mesh's correlation id is the call id when the caller sends none of its own...
        ((("x-request-id", "mesh-1"),), "mesh-1"),
        # ...and only then.
        ((("x-request-id", "mesh-2"), ("x-call-id", "call-2")), "call-2"),
    ],
)
async def test_the_call_id_is_the_callers_logged_returned_and_carried_to_peers(
    access_log: _Lines,
    relay_address: str,
    namespace: str,
    sent: tuple[tuple[str, str], ...],
    expected: str,
) -> None:
    assert await relay_call_id(relay_address, namespace, sent) == expected
    # The relay's own line, and those of the two calls it made to TranscriptService.
    await wait_for(access_log.has(3))
    rpc_lines = [line for line in access_log.lines if line["message"] == "rpc"]
    assert [line["call_id"] for line in rpc_lines] == [expected] * 3
    assert all("request_id" not in line for line in rpc_lines)


async def test_a_call_without_a_call_id_gets_one_made_by_the_server(
    access_log: _Lines, relay_address: str, namespace: str
) -> None:
    first = await relay_call_id(relay_address, namespace, ())
    second = await relay_call_id(relay_address, namespace, (("x-call-id", ""),))
    assert first and second and first != second
    await wait_for(access_log.has(6))
    logged = {line["call_id"] for line in access_log.lines if line["message"] == "rpc"}
    assert logged == {first, second}


async def test_failed_peer_call_marks_the_client_span(
    exporter: InMemorySpanExporter, relay_address: str
) -> None:
    # An invalid namespace: the transcript answers INVALID_ARGUMENT, the relay passes it on.
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call_relay(relay_address, "not a namespace!")
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    spans = await finished_with(exporter, RELAY_SERVER)
    client = by_name(
        spans, "runifold.transcript.v1.TranscriptService/CreateConversation", SpanKind.CLIENT
    )
    assert client.status.description == "INVALID_ARGUMENT"
    relay = by_name(spans, "runifold.test.Relay/Relay", SpanKind.SERVER)
    assert relay.attributes is not None and relay.attributes["rpc.grpc.status_code"] == 3


def test_off_by_default_and_switched_by_the_environment() -> None:
    assert not tracing.enabled()
    assert not tracing.wanted({})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"})
    assert tracing.wanted({"RUNIFOLD_TRACING": "otlp"})
    assert not tracing.wanted(
        {"RUNIFOLD_TRACING": "off", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}
    )
    with pytest.raises(ValueError, match="RUNIFOLD_TRACING"):
        tracing.wanted({"RUNIFOLD_TRACING": "jaeger"})
    # Off: nothing is added to outbound metadata and no span is opened.
    assert tracing.start_server_span("/a.B/C", object(), "call") is None  # context untouched
    assert all(key != "traceparent" for key, _ in outbound_metadata())


def test_configure_builds_an_otlp_exporter() -> None:
    env = {"RUNIFOLD_TRACING": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}
    try:
        assert tracing.configure("test", env)
        assert tracing.enabled()
    finally:
        tracing.shutdown()
    assert not tracing.enabled()
