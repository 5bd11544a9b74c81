"""Authentication and TLS through a real server."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import jwt
import pytest
import trustme
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from grpc_health.v1 import health_pb2

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.common import stubs
from services.common.auth import INTERNAL_HEADER, ON_BEHALF_HEADER, XFCC_HEADER, AuthSettings
from services.common.server import RunningServer, serving
from services.common.status import error_info
from services.transcript.component import TranscriptComponent
from tests.support.grpc_calls import Metadata, authorization, jwt_token, user, write_pem
from tests.support.settings import server_settings
from tests.support.stack import Stack, full_stack
from tests.support.waiting import wait_for

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


async def test_a_token_for_the_wrong_key_type_is_unauthenticated_not_internal(
    shared_database_url: str, tmp_path: Path, namespace: str
) -> None:
    """An ES256 token naming an RSA key (or naming none) made PyJWT raise TypeError,
    which the guard answered INTERNAL: anyone could feed the server-error alert."""
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key()))
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**public, "kid": "rsa-1"}]}))
    auth = AuthSettings(mode="jwt", jwt_jwks_file=str(jwks), jwt_audience="runifold")
    claims = {"aud": "runifold", "exp": time.time() + 60, "namespaces": [namespace]}
    ec_key = ec.generate_private_key(ec.SECP256R1())
    async with (
        serving(
            [TranscriptComponent()], server_settings(), database_url=shared_database_url, auth=auth
        ) as running,
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        stub = stubs.transcript(channel)
        good = jwt.encode(claims, rsa_key, algorithm="RS256", headers={"kid": "rsa-1"})
        await stub.ListConversations(
            pb.ListConversationsRequest(namespace=namespace), metadata=authorization(good)
        )
        for headers in ({"kid": "rsa-1"}, None):
            token = jwt.encode(claims, ec_key, algorithm="ES256", headers=headers)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.ListConversations(
                    pb.ListConversationsRequest(namespace=namespace), metadata=authorization(token)
                )
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


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


# -- mesh: the all-in-one server calls itself ------------------------------------------

APP = "spiffe://cluster.local/ns/apps/sa/app-1"
SIDECAR = "By=spiffe://cluster.local/ns/runifold/sa/runifold;Hash=0a1b2c"


def from_sidecar(uri: str = APP) -> Metadata:
    """What the local sidecar adds to a call from a client with this URI SAN."""
    return ((XFCC_HEADER, f"{SIDECAR};URI={uri}"),)


@pytest.fixture(scope="module")
def mesh_namespace() -> str:
    return f"mesh-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
async def mesh_stack(
    shared_database_url: str, tmp_path_factory: pytest.TempPathFactory, mesh_namespace: str
) -> AsyncIterator[Stack]:
    folder = tmp_path_factory.mktemp("mesh")
    identities = folder / "identities.json"
    identities.write_text(json.dumps({APP: {"namespaces": [mesh_namespace]}}))
    auth = AuthSettings(mode="mesh", mesh_trust_xfcc=True, mesh_identities_file=str(identities))
    # The offline model (what `make run` serves): the turn needs no model server.
    async with full_stack(shared_database_url, folder, None, auth=auth) as running:
        yield running


async def test_a_turn_through_the_all_in_one_server_under_mesh(
    mesh_stack: Stack, mesh_namespace: str
) -> None:
    """Every internal call (agent to transcript, summary and memory; summary and memory
    to transcript) authenticates with the server's own credential, acting for the
    caller's namespace: the turn summarizes, retrieves a memory and commits."""
    namespace, caller = mesh_namespace, from_sidecar()
    created = await mesh_stack.transcript.CreateConversation(
        transcript_pb.CreateConversationRequest(), metadata=caller
    )
    cid = created.conversation.conversation_id
    await mesh_stack.transcript.AppendEntries(
        transcript_pb.AppendEntriesRequest(
            namespace=namespace,
            conversation_id=cid,
            expected_version=0,
            messages=[user(f"earlier message {i + 1}") for i in range(40)],
        ),
        metadata=caller,
    )
    fact = "The user's favourite colour is teal."
    await mesh_stack.memory.UpsertMemory(  # memory checks the sources with transcript
        memory_pb.UpsertMemoryRequest(
            namespace=namespace,
            content=fact,
            sources=[
                memory_pb.MemorySource(conversation_id=cid, from_sequence=1, through_sequence=2)
            ],
        ),
        metadata=caller,
    )

    async def indexed() -> bool:
        found = await mesh_stack.memory.SearchMemories(
            memory_pb.SearchMemoriesRequest(namespace=namespace, query="favourite colour", limit=3),
            metadata=caller,
        )
        return any(r.memory.content == fact for r in found.results)

    await wait_for(indexed, timeout=30)
    result = await mesh_stack.agent.RunConversation(
        agent_pb.RunConversationRequest(
            namespace=namespace,
            conversation_id=cid,
            input=[user("Which colour do I like?")],
            policy=agent_pb.ContextPolicy(
                window=16, summary_batch=64, memory_limit=4, summary_mode=agent_pb.SUMMARY_MODE_AUTO
            ),
        ),
        metadata=caller,
    )
    assert result.context.summary_through_sequence == 24  # summarized in the turn
    assert len(result.context.memory_ids) == 1
    assert (result.first_sequence, result.last_sequence) == (41, 42)
    summary = await mesh_stack.summary.GetSummary(
        summary_pb.GetSummaryRequest(namespace=namespace, conversation_id=cid), metadata=caller
    )
    assert summary.summary.through_sequence == 24


async def test_a_background_summary_job_under_mesh_in_the_all_in_one_server(
    mesh_stack: Stack, mesh_namespace: str
) -> None:
    namespace, caller = mesh_namespace, from_sidecar()
    created = await mesh_stack.transcript.CreateConversation(
        transcript_pb.CreateConversationRequest(namespace=namespace), metadata=caller
    )
    cid = created.conversation.conversation_id
    await mesh_stack.transcript.AppendEntries(
        transcript_pb.AppendEntriesRequest(
            namespace=namespace,
            conversation_id=cid,
            expected_version=0,
            messages=[user(f"message {i + 1}") for i in range(12)],
        ),
        metadata=caller,
    )
    await mesh_stack.summary.RequestSummary(
        summary_pb.RequestSummaryRequest(
            namespace=namespace, conversation_id=cid, window=4, summary_batch=8
        ),
        metadata=caller,
    )

    async def summarized() -> bool:
        got = await mesh_stack.summary.GetSummary(
            summary_pb.GetSummaryRequest(namespace=namespace, conversation_id=cid),
            metadata=caller,
        )
        return bool(got.summary.through_sequence == 8)

    await wait_for(summarized, timeout=30)


@pytest.mark.parametrize(
    "metadata",
    [
        # A forged internal credential, alone or beside a real identity: refused, not ignored.
        ((INTERNAL_HEADER, "forged"), (ON_BEHALF_HEADER, "*")),
        ((INTERNAL_HEADER, "forged"), *from_sidecar()),
        # The server's credential never leaves it, and no header stands in for it.
        ((ON_BEHALF_HEADER, "*"),),
        # Two XFCC headers (the last one won): which one the sidecar wrote is a guess.
        (*from_sidecar("spiffe://cluster.local/ns/apps/sa/other"), *from_sidecar()),
        # An identity smuggled into the sidecar's element.
        ((XFCC_HEADER, f'{SIDECAR};Subject="CN=x,URI={APP}";URI='),),
    ],
)
async def test_forged_mesh_identities_are_refused_by_the_all_in_one_server(
    mesh_stack: Stack, mesh_namespace: str, metadata: Metadata
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await mesh_stack.transcript.ListConversations(
            transcript_pb.ListConversationsRequest(namespace=mesh_namespace), metadata=metadata
        )
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert error_info(caught.value).reason == "UNAUTHENTICATED"  # type: ignore[union-attr]
