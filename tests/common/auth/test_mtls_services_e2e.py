"""Mutual TLS between the services, with the caller's identity carried across.

Two real servers, both requiring client certificates from one CA and JWTs:
TranscriptService alone, and SummaryService + AgentService. A turn sent to the
second makes the agent call SummaryService and TranscriptService over mTLS,
forwarding the caller's token, so each service enforces the same namespace rule.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
import trustme

from runifold.agent.v1 import agent_service_pb2 as pb
from runifold.common.v1 import common_pb2
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.agent.component import AgentComponent
from services.agent.config import AgentConfig
from services.common import stubs
from services.common.auth import AuthSettings
from services.common.server import Component, serving
from services.common.status import error_info
from services.summary.component import SummaryComponent
from services.summary.config import SummaryConfig
from services.transcript.component import TranscriptComponent
from tests.support.grpc_calls import Metadata, authorization, jwt_token, write_pem
from tests.support.settings import server_settings

SECRET = "mtls-secret-" + "z" * 32


def token(namespace: str) -> Metadata:
    return authorization(jwt_token(SECRET, namespace))


async def test_services_talk_over_mutual_tls_and_carry_the_callers_identity(
    shared_database_url: str, tmp_path: Path, namespace: str
) -> None:
    ca = trustme.CA()
    server_cert = ca.issue_cert("localhost", "127.0.0.1")
    service_cert = ca.issue_cert("agent.runifold.internal")
    app_cert = ca.issue_cert("app.example")

    auth = AuthSettings(
        mode="jwt",
        jwt_secret=SECRET,
        jwt_audience="runifold",
        tls_cert_file=write_pem(tmp_path / "server.pem", server_cert.cert_chain_pems[0]),
        tls_key_file=write_pem(tmp_path / "server.key", server_cert.private_key_pem),
        tls_client_ca_file=write_pem(tmp_path / "ca.pem", ca.cert_pem),
        tls_ca_file=str(tmp_path / "ca.pem"),
        tls_client_cert_file=write_pem(tmp_path / "service.pem", service_cert.cert_chain_pems[0]),
        tls_client_key_file=write_pem(tmp_path / "service.key", service_cert.private_key_pem),
        tls_server_name="localhost",
    )
    app_credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.cert_pem.bytes(),
        private_key=app_cert.private_key_pem.bytes(),
        certificate_chain=app_cert.cert_chain_pems[0].bytes(),
    )
    async with serving(
        [TranscriptComponent()], server_settings(), database_url=shared_database_url, auth=auth
    ) as transcripts:
        settings = server_settings(
            TRANSCRIPT_SERVICE_ADDR=f"localhost:{transcripts.port}",
            MEMORY_SERVICE_ADDR="localhost:9",
        )  # unused: no memory
        components: list[Component] = [
            SummaryComponent(SummaryConfig.from_env({"RUNIFOLD_SUMMARY_WORKERS": "0"})),
            AgentComponent(AgentConfig()),
        ]
        async with (
            serving(
                components,
                settings,
                database_url=shared_database_url,
                extras={"all_in_one": True},
                auth=auth,
            ) as agents,
            grpc.aio.secure_channel(f"localhost:{agents.port}", app_credentials) as channel,
        ):
            agent = stubs.agent(channel)
            result = await agent.RunConversation(
                pb.RunConversationRequest(
                    create_if_missing=True,
                    input=[common_pb2.Message(role=common_pb2.ROLE_USER, text="over mTLS")],
                ),
                metadata=token(namespace),
                timeout=30,
            )
            # The namespace came from the token, and both peer calls carried it.
            assert result.created and result.conversation_version == 1

            async with grpc.aio.secure_channel(
                f"localhost:{transcripts.port}", app_credentials
            ) as direct:
                got = await stubs.transcript(direct).GetConversation(
                    transcript_pb.GetConversationRequest(
                        namespace=namespace, conversation_id=result.conversation_id
                    ),
                    metadata=token(namespace),
                )
                assert got.conversation.last_sequence == 2
                # Another tenant's token is refused by the transcript service itself.
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stubs.transcript(direct).GetConversation(
                        transcript_pb.GetConversationRequest(
                            namespace=namespace, conversation_id=result.conversation_id
                        ),
                        metadata=token(namespace + "-other"),
                    )
                assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert error_info(caught.value).reason == "NAMESPACE_NOT_GRANTED"  # type: ignore[union-attr]

            # Without a client certificate, or in plaintext, nothing gets through.
            anonymous = grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes())
            target = f"localhost:{transcripts.port}"
            for bad_channel in (
                grpc.aio.secure_channel(target, anonymous),
                grpc.aio.insecure_channel(target),
            ):
                async with bad_channel as bad:
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await stubs.transcript(bad).GetConversation(
                            transcript_pb.GetConversationRequest(
                                namespace=namespace, conversation_id=result.conversation_id
                            ),
                            metadata=token(namespace),
                            timeout=5,
                        )
                    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
