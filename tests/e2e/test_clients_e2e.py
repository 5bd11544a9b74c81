"""The Python and TypeScript clients against the real stack: a turn, a conflict, and a
summary-required round trip each (issue 8). The model is the fake OpenAI server; a
message that says "[race:<namespace>:<conversation id>]" makes it let a concurrent writer in
before it answers, so the turn deterministically loses the race."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from runifold.common.v1 import common_pb2
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client import (
    AsyncClient,
    Client,
    ConversationContextPolicy,
    SummaryRequired,
    TurnConflict,
    VersionConflict,
)
from tests.fakes.openai_server import FakeReply, fake_openai
from tests.stack import Stack, full_stack

ROOT = Path(__file__).resolve().parents[2]
NODE = ROOT / "clients" / "node"
RACE = re.compile(r"\[race:([A-Za-z0-9_.-]+):([0-9a-f-]{36})\]")


@pytest.fixture(scope="module")
async def stack(
    shared_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with (
        fake_openai() as model,
        full_stack(shared_database_url, tmp_path_factory.mktemp("clients"), model) as running,
    ):
        model.respond_with(racing_responder(running))
        yield running


def racing_responder(stack: Stack) -> Any:
    """Answer; when asked to, first append to the conversation as a concurrent writer."""

    async def respond(body: dict[str, Any]) -> FakeReply:
        asked = body["messages"][-1].get("content") or ""
        match = RACE.search(asked)
        if match:
            await stack.transcript.AppendEntries(
                transcript_pb.AppendEntriesRequest(
                    namespace=match[1],
                    conversation_id=match[2],
                    messages=[
                        common_pb2.Message(role=common_pb2.ROLE_USER, text="a concurrent writer")
                    ],
                )
            )
        return FakeReply(text="Here is my answer.", usage=(40, 5))

    return respond


async def test_python_async_client_turn_conflict_and_summary_required(
    stack: Stack, namespace: str
) -> None:
    async with AsyncClient(stack.address, namespace=namespace) as client:
        result = await client.run_conversation(
            "What did we decide?",
            create_if_missing=True,
            policy=ConversationContextPolicy(window=16).with_semantic_memory(8),
        )
        assert result.text == "Here is my answer." and result.version == 1
        cid = result.conversation_id

        with pytest.raises(VersionConflict) as stale:
            await client.append(cid, "late", expected_version=0)
        assert stale.value.current_version == 1

        with pytest.raises(TurnConflict) as lost:
            await client.run_conversation(f"again [race:{namespace}:{cid}]", conversation_id=cid)
        assert lost.value.current_version == 2 and lost.value.expected_version == 1
        assert lost.value.outcome.text == "Here is my answer."
        assert lost.value.outcome.usage.output_tokens == 5

        await client.append(cid, [f"filler {i}" for i in range(30)])
        policy = ConversationContextPolicy(window=8, summary_batch=8)
        with pytest.raises(SummaryRequired) as required:
            await client.run_conversation("and now?", conversation_id=cid, policy=policy)
        assert required.value.backlog == 33 - 8  # 2 + 1 (the racer) + 30 entries, window 8
        done = await client.run_conversation(
            "and now?", conversation_id=cid, policy=policy.with_auto_summary(8)
        )
        assert done.context is not None and done.context.summary_through_sequence == 25


async def test_python_blocking_client(stack: Stack, namespace: str) -> None:
    def use() -> None:  # in a thread: the server shares this test's event loop
        with Client(stack.address, namespace=namespace) as client:
            result = client.run_conversation("hello")
            assert result.created and result.last_sequence == 2
            entries = list(client.entries(result.conversation_id))
            assert [e.message.text for e in entries] == ["hello", "Here is my answer."]

    await asyncio.to_thread(use)


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is part of this machine kind")
async def test_typescript_client(stack: Stack) -> None:
    if not (NODE / "node_modules").exists():
        await _run(["npm", "ci", "--no-audit", "--no-fund"], NODE)
    await _run(["npx", "tsc", "-p", "."], NODE)
    env = {**os.environ, "RUNIFOLD_TARGET": stack.address}
    output = await _run(["node", "--test", "dist/test/"], NODE, env)
    assert "# fail 0" in output and "# pass 4" in output, output


async def _run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    process = await asyncio.create_subprocess_exec(
        *command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(process.communicate(), timeout=300)
    text = out.decode(errors="replace")
    assert process.returncode == 0, f"{' '.join(command)} failed:\n{text}"
    return text
