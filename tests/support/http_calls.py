"""Calling the services over the HTTP port (RUNIFOLD_HTTP_LISTEN), as curl and browsers do.

`post_json` is curl: a POST of a JSON body to `/<package>.<Service>/<Method>`, the answer
as status, headers and parsed JSON. `connect_call` is a Connect (or gRPC-Web) client of
any RPC, from its descriptor, through connectrpc's generic client, with proto3 JSON or
binary protobuf on the wire; a failure comes back as the ConnectError it raised.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from connectrpc.client import ConnectClient
from connectrpc.code import Code as ConnectCode
from connectrpc.compat import google_protobuf_binary_codec, google_protobuf_json_codec
from connectrpc.errors import ConnectError
from connectrpc.method import IdempotencyLevel, MethodInfo, StreamType
from connectrpc.protocol import ProtocolType
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from google.rpc import error_details_pb2

TIMEOUT_S = 60.0


@dataclass(frozen=True)
class JsonReply:
    """What a JSON POST got back."""

    status: int
    headers: httpx.Headers
    body: Any

    @property
    def error_info(self) -> error_details_pb2.ErrorInfo | None:
        """The ErrorInfo of a Connect error body (its first detail), or None."""
        for detail in self.body.get("details", []) if isinstance(self.body, dict) else []:
            if detail.get("type") == "google.rpc.ErrorInfo":
                return error_details_pb2.ErrorInfo.FromString(_b64(detail["value"]))
        return None

    @property
    def field_violations(self) -> list[str]:
        """The fields a Connect error body's BadRequest detail names ([] without one)."""
        details = self.body.get("details", []) if isinstance(self.body, dict) else []
        return [
            violation.field
            for detail in details
            if detail.get("type") == "google.rpc.BadRequest"
            for violation in error_details_pb2.BadRequest.FromString(
                _b64(detail["value"])
            ).field_violations
        ]


def _b64(value: str) -> bytes:
    # Connect sends details base64 without padding.
    return base64.b64decode(value + "=" * (-len(value) % 4))


async def post_json(
    base_url: str,
    method: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
) -> JsonReply:
    """`curl -H 'Content-Type: application/json' -d BODY BASE/METHOD`, where `method` is
    "runifold.transcript.v1.TranscriptService/GetConversation"."""
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        response = await client.post(
            f"{base_url}/{method}",
            json=dict(body),
            headers={"content-type": "application/json", **(headers or {})},
        )
    return JsonReply(response.status_code, response.headers, response.json())


def method_info(method: MethodDescriptor) -> MethodInfo[Any, Any]:
    """connectrpc's description of an RPC, over google.protobuf's message classes."""
    return MethodInfo(
        name=method.name,
        service_name=method.containing_service.full_name,
        input=message_factory.GetMessageClass(method.input_type),
        output=message_factory.GetMessageClass(method.output_type),
        idempotency_level=IdempotencyLevel.UNKNOWN,
        stream_type=StreamType.SERVER_STREAM if method.server_streaming else StreamType.UNARY,
    )


async def connect_call(
    base_url: str,
    method: MethodDescriptor,
    request: Message,
    headers: Sequence[tuple[str, str]] = (),
    *,
    protocol: ProtocolType = ProtocolType.CONNECT,
    json: bool = True,
    timeout_s: float = TIMEOUT_S,
) -> list[Message]:
    """The replies of one call (one for a unary RPC, the stream's for a streaming one);
    raises the call's ConnectError."""
    codec = google_protobuf_json_codec() if json else google_protobuf_binary_codec()
    info = method_info(method)
    async with ConnectClient(
        base_url, codec=codec, protocol=protocol, timeout_ms=int(timeout_s * 1000)
    ) as client:
        if method.server_streaming:
            return [
                reply
                async for reply in client.execute_server_stream(
                    request=request, method=info, headers=dict(headers)
                )
            ]
        return [await client.execute_unary(request=request, method=info, headers=dict(headers))]


def error_info(error: ConnectError) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo detail of a Connect error, or None."""
    for detail in error.details:
        if detail.type_name == "google.rpc.ErrorInfo":
            return error_details_pb2.ErrorInfo.FromString(detail.message_bytes)
    return None


def detail(error: ConnectError, cls: type[Any]) -> Any:
    """The first detail of type `cls` of a Connect error, or None."""
    for item in error.details:
        if item.type_name == cls.DESCRIPTOR.full_name:
            return cls.FromString(item.message_bytes)
    return None


def grpc_code_name(code: ConnectCode) -> str:
    """The gRPC name of a Connect code ("CANCELLED" for Connect's "canceled")."""
    return "CANCELLED" if code is ConnectCode.CANCELED else code.name
