"""Page tokens across replicas: a token from one TranscriptService process is good on
another that shares its secret, and a server reachable beyond loopback refuses to start
without the secret (a secret of its own would break every token on the next replica)."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import grpc

from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs
from tests.support.process import service_process
from tests.support.tools import run


def test_a_server_beyond_loopback_refuses_to_start_without_the_secret() -> None:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("RUNIFOLD_") and k != "DATABASE_URL"
    }
    env.update(
        {"RUNIFOLD_LISTEN": "0.0.0.0:0", "RUNIFOLD_ALLOW_INSECURE": "1", "RUNIFOLD_AUTH": "none"}
    )
    refused = run(sys.executable, "-m", "services.transcript", env=env)
    assert refused.returncode == 2
    assert "RUNIFOLD_PAGE_TOKEN_SECRET" in refused.stderr
    assert "Traceback" not in refused.stderr


async def test_a_page_token_from_one_replica_pages_on_another(
    fresh_database_url: str, tmp_path: Path
) -> None:
    namespace = f"replicas-{uuid.uuid4().hex[:8]}"
    env = {"DATABASE_URL": fresh_database_url, "RUNIFOLD_SUMMARY_WORKERS": "0"}
    async with (
        service_process("services.transcript", env, tmp_path / "a") as first,
        service_process("services.transcript", env, tmp_path / "b") as second,
        grpc.aio.insecure_channel(first.address) as to_first,
        grpc.aio.insecure_channel(second.address) as to_second,
    ):
        one, two = stubs.transcript(to_first), stubs.transcript(to_second)
        made = sorted(
            [
                (
                    await one.CreateConversation(pb.CreateConversationRequest(namespace=namespace))
                ).conversation.conversation_id
                for _ in range(5)
            ]
        )
        page = await one.ListConversations(
            pb.ListConversationsRequest(namespace=namespace, page_size=2)
        )
        rest = await two.ListConversations(
            pb.ListConversationsRequest(
                namespace=namespace, page_size=10, page_token=page.next_page_token
            )
        )
        listed = [c.conversation_id for c in [*page.conversations, *rest.conversations]]
        assert listed == made and not rest.next_page_token
