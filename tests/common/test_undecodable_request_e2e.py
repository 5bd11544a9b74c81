"""A request whose bytes are not a valid message is INVALID_ARGUMENT / INVALID_REQUEST.

grpc's own answer would be UNKNOWN with the parser's exception text; the
shared interceptor answers instead (tests/system/security/test_hostile_input.py runs
this over every RPC).
"""

from __future__ import annotations

import uuid

import grpc
import pytest

from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common.server import RunningServer
from services.common.status import error_info

METHOD = "/runifold.transcript.v1.TranscriptService/GetConversation"


async def test_invalid_utf8_and_corrupt_bytes_are_invalid_argument(
    transcript_server: RunningServer, namespace: str
) -> None:
    not_utf8 = b"\x12\x02\xff\xfe"  # field 2 (namespace), two bytes that are not UTF-8
    corrupt = b"\x0a\xff\xff\xff\xff\x0f"  # a length beyond the message
    async with grpc.aio.insecure_channel(transcript_server.address) as channel:
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(METHOD)
        for body in (not_utf8, corrupt):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(body, timeout=10)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, body
            assert "DecodeError" not in (refused.value.details() or "")
            info = error_info(refused.value)
            assert info is not None and info.reason == "INVALID_REQUEST", body
        # The method still answers valid requests: a decodable one reaches validation
        # (the conversation id is not a UUID) ...
        bad_id = pb.GetConversationRequest(namespace=namespace, conversation_id=str(namespace))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(bad_id.SerializeToString(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        info = error_info(caught.value)
        assert info is not None and info.reason == "INVALID_CONVERSATION_ID"
        # ... and a well-formed one reaches the store.
        unknown = pb.GetConversationRequest(namespace=namespace, conversation_id=str(uuid.uuid4()))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(unknown.SerializeToString(), timeout=10)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        info = error_info(caught.value)
        assert info is not None and info.reason == "CONVERSATION_NOT_FOUND"
