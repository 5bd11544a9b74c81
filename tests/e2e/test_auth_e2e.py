"""Authentication and TLS through a real server."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2

from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs
from services.common.auth import AuthSettings
from services.common.server import RunningServer, serving
from services.common.status import error_info
from services.transcript.component import TranscriptComponent
from tests.conftest import server_settings
from tests.grpc_support import authorization, jwt_token, write_pem

SECRET = "e2e-secret-" + "x" * 32


@pytest.fixture
async def jwt_server(shared_database_url: str) -> AsyncIterator[RunningServer]:
    auth = AuthSettings(mode="jwt", jwt_secret=SECRET, jwt_audience="runifold")
    async with serving(
        [TranscriptComponent()], server_settings(), database_url=shared_database_url, auth=auth
    ) as running:
        yield running


async def test_jwt_grants_namespaces_and_fills_an_empty_one(
    jwt_server: RunningServer, namespace: str
) -> None:
    other = namespace + "-b"
    async with grpc.aio.insecure_channel(jwt_server.address) as channel:
        stub = stubs.transcript(channel)
        mine = authorization(jwt_token(SECRET, namespace))
        created = await stub.CreateConversation(pb.CreateConversationRequest(), metadata=mine)
        assert created.conversation.namespace == namespace  # filled from the identity
        cid = created.conversation.conversation_id

        theirs = authorization(jwt_token(SECRET, other))
        for call in (
            stub.GetConversation(
                pb.GetConversationRequest(namespace=namespace, conversation_id=cid), metadata=theirs
            ),
            stub.GetConversation(
                pb.GetConversationRequest(namespace=other, conversation_id=cid), metadata=mine
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert error_info(caught.value).reason == "NAMESPACE_NOT_GRANTED"  # type: ignore[union-attr]

        for metadata in (
            (),
            authorization(jwt_token(SECRET, namespace, exp=time.time() - 999)),
            authorization(jwt_token(SECRET, namespace, aud="x")),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.GetConversation(
                    pb.GetConversationRequest(namespace=namespace, conversation_id=cid),
                    metadata=metadata,
                )
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED

        # Probes need no token.
        health = await stubs.health(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING


async def test_mutual_tls_requires_a_client_certificate(
    shared_database_url: str, tmp_path: Path, namespace: str
) -> None:
    ca = trustme.CA()
    server_cert = ca.issue_cert("localhost", "127.0.0.1")
    client_cert = ca.issue_cert("client.runifold.test")
    auth = AuthSettings(
        tls_cert_file=write_pem(tmp_path / "server.pem", server_cert.cert_chain_pems[0]),
        tls_key_file=write_pem(tmp_path / "server.key", server_cert.private_key_pem),
        tls_client_ca_file=write_pem(tmp_path / "ca.pem", ca.cert_pem),
    )
    async with serving(
        [TranscriptComponent()], server_settings(), database_url=shared_database_url, auth=auth
    ) as running:
        address = f"localhost:{running.port}"
        good = grpc.ssl_channel_credentials(
            root_certificates=ca.cert_pem.bytes(),
            private_key=client_cert.private_key_pem.bytes(),
            certificate_chain=client_cert.cert_chain_pems[0].bytes(),
        )
        async with grpc.aio.secure_channel(address, good) as channel:
            reply = await stubs.transcript(channel).CreateConversation(
                pb.CreateConversationRequest(namespace=namespace), timeout=10
            )
            assert reply.created
        anonymous = grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes())
        async with grpc.aio.secure_channel(address, anonymous) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stubs.transcript(channel).CreateConversation(
                    pb.CreateConversationRequest(namespace=namespace), timeout=5
                )
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        async with grpc.aio.insecure_channel(address) as channel:
            with pytest.raises(grpc.aio.AioRpcError):
                await stubs.transcript(channel).CreateConversation(
                    pb.CreateConversationRequest(namespace=namespace), timeout=5
                )
