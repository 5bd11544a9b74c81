"""README's "Use a real model": each documented command, as written, puts the model it
names behind the agent, the summarizer and the memory curator of `python -m services`.

The lines are read from the README itself; only the endpoint's URL is pointed at the
project's fake OpenAI-compatible server (tests/support/fake_openai.py), which records
what each role sent: the model name, and the API key where the line gives one."""

from __future__ import annotations

import re
import shlex
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.common import stubs
from tests.support.fake_openai import FakeReply, fake_openai
from tests.support.grpc_calls import user
from tests.support.process import service_process

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def documented_commands() -> list[tuple[str, dict[str, str]]]:
    """The README's "Use a real model" commands: (the provider's comment, the variables)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("**Use a real model.**") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    commands, name = [], ""
    for line in block[1].replace("\\\n", " ").splitlines():
        if line.startswith("#"):
            name = line.lstrip("# ").split(" (")[0]
        elif line.strip():
            words = shlex.split(line)
            assert words[-2:] == ["make", "run"], line
            commands.append((name, dict(word.split("=", 1) for word in words[:-2])))
    return commands


COMMANDS = documented_commands()


def test_the_readme_shows_openai_vllm_and_ollama() -> None:
    assert [name for name, _ in COMMANDS] == ["OpenAI", "vLLM", "Ollama"]
    for _, variables in COMMANDS:
        assert variables["RUNIFOLD_MODEL_URL"].startswith(("http://", "https://"))
        assert variables["RUNIFOLD_MODEL_NAME"]


@pytest.mark.parametrize(("name", "variables"), COMMANDS, ids=[name for name, _ in COMMANDS])
async def test_a_documented_model_setting_switches_every_role(
    name: str, variables: dict[str, str], fresh_database_url: str, tmp_path: Path
) -> None:
    namespace = f"real-model-{uuid.uuid4().hex[:8]}"
    async with fake_openai() as model:

        def respond(body: Any) -> FakeReply:
            if body.get("response_format"):  # the curator asks for structured proposals
                return FakeReply(text='{"proposals": []}', usage=(30, 4))
            return FakeReply(text=f"an answer from {body['model']}", usage=(20, 5))

        model.respond_with(respond)
        env = {
            **variables,
            "RUNIFOLD_MODEL_URL": model.base_url,
            "DATABASE_URL": fresh_database_url,
            "RUNIFOLD_SUMMARY_WORKERS": "0",
        }
        async with (
            service_process("services", env, tmp_path) as server,
            grpc.aio.insecure_channel(server.address) as channel,
        ):
            turn = await stubs.agent(channel).RunConversation(
                agent_pb.RunConversationRequest(
                    namespace=namespace, input=[user("Hello!")], create_if_missing=True
                ),
                timeout=60,
            )
            cid = turn.conversation_id
            await stubs.transcript(channel).AppendEntries(
                transcript_pb.AppendEntriesRequest(
                    namespace=namespace,
                    conversation_id=cid,
                    messages=[user(f"I always drink tea number {i}.") for i in range(6)],
                )
            )
            await stubs.summary(channel).Summarize(
                summary_pb.SummarizeRequest(
                    namespace=namespace, conversation_id=cid, window=2, summary_batch=8
                ),
                timeout=60,
            )
            await stubs.memory(channel).ProposeMemories(
                memory_pb.ProposeMemoriesRequest(
                    namespace=namespace, conversation_id=cid, from_sequence=1, through_sequence=8
                ),
                timeout=60,
            )
    assert turn.outcome.output[0].text == f"an answer from {variables['RUNIFOLD_MODEL_NAME']}"
    requests = model.chat_requests
    assert len(requests) >= 3, "the agent, the summarizer and the curator each called it"
    assert {r.body["model"] for r in requests} == {variables["RUNIFOLD_MODEL_NAME"]}
    key = variables.get("RUNIFOLD_MODEL_API_KEY")
    for request in requests:
        sent = {k.lower(): v for k, v in request.headers.items()}.get("authorization")
        assert sent == (f"Bearer {key}" if key else None), name
