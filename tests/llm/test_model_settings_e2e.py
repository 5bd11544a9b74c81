"""One model setting switches every role (DESIGN.md section 8, "model settings"): the
all-in-one server as production starts it (`python -m services`, its own process) with
`RUNIFOLD_MODEL_URL` pointing at the fake OpenAI-compatible server, and nothing else
about models. The agent's turn, the summarizer's pass and the curator's proposal each
reach the fake, under the shared model name and key; the names used before still switch
a role, with a warning naming the replacement and never the value.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import grpc

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.common import stubs
from services.memory.proposals.prompt import SYSTEM_PROMPT as PROPOSER_PROMPT
from tests.support.fake_openai import FakeOpenAI, FakeReply, ReceivedRequest, fake_openai
from tests.support.grpc_calls import user
from tests.support.process import ServiceProcess, service_process

SUMMARY_OPENING = "You maintain the running summary of a conversation"
AGENT_ANSWER = "The agent's answer, from the fake model."
SUMMARY_TEXT = "The summarizer's summary, from the fake model."
SHARED_KEY = "sk-shared-0123456789"


def role_of(request: ReceivedRequest) -> str:
    """Which role sent a chat request: its system prompt says."""
    first = request.messages[0] if request.messages else {}
    system = first.get("content", "") if first.get("role") == "system" else ""
    if system == PROPOSER_PROMPT:
        return "curator"
    if system.startswith(SUMMARY_OPENING):
        return "summary"
    return "agent"


def answer(body: Any) -> FakeReply:
    """Each role's answer: text for the agent and the summarizer, JSON for the curator."""
    role = role_of(ReceivedRequest("/v1/chat/completions", body, {}, 0.0))
    if role == "curator":
        return FakeReply(text=json.dumps({"proposals": []}), usage=(40, 5))
    return FakeReply(text=SUMMARY_TEXT if role == "summary" else AGENT_ANSWER, usage=(30, 6))


def header(request: ReceivedRequest, name: str) -> str:
    return next((v for k, v in request.headers.items() if k.lower() == name.lower()), "")


def server_env(database_url: str, model: FakeOpenAI, **models: str) -> dict[str, str]:
    """The all-in-one server's environment: the embeddings from the fake too (no local
    model to load), no summary workers (only the calls below reach the model), and the
    model variables given."""
    return {
        "DATABASE_URL": database_url,
        "RUNIFOLD_SUMMARY_WORKERS": "0",
        "RUNIFOLD_EMBEDDINGS": "openai",
        "RUNIFOLD_EMBEDDINGS_URL": model.base_url,
        "RUNIFOLD_EMBEDDINGS_MODEL": "fake-embeddings",
        "RUNIFOLD_EMBEDDINGS_DIMENSION": "8",
        **models,
    }


async def exercise_every_role(process: ServiceProcess, namespace: str) -> None:
    """A turn (the agent), a Summarize pass (the summarizer) and ProposeMemories (the
    curator) over one conversation."""
    async with grpc.aio.insecure_channel(process.address) as channel:
        turn = await stubs.agent(channel).RunConversation(
            agent_pb.RunConversationRequest(
                namespace=namespace, input=[user("I live in Porto.")], create_if_missing=True
            ),
            timeout=60,
        )
        assert [m.text for m in turn.outcome.output] == [AGENT_ANSWER]
        cid = turn.conversation_id
        await stubs.transcript(channel).AppendEntries(
            transcript_pb.AppendEntriesRequest(
                namespace=namespace,
                conversation_id=cid,
                messages=[user(f"note {n}") for n in range(4)],
            )
        )
        summarized = await stubs.summary(channel).Summarize(
            summary_pb.SummarizeRequest(
                namespace=namespace,
                conversation_id=cid,
                window=2,
                summary_batch=8,
                max_summary_passes=1,
            ),
            timeout=60,
        )
        assert summarized.summary.text == SUMMARY_TEXT
        proposed = await stubs.memory(channel).ProposeMemories(
            memory_pb.ProposeMemoriesRequest(
                namespace=namespace, conversation_id=cid, from_sequence=1, through_sequence=1
            ),
            timeout=60,
        )
        assert proposed.proposer == "openai"


async def test_one_shared_model_url_switches_the_agent_the_summarizer_and_the_curator(
    fresh_database_url: str, tmp_path: Path
) -> None:
    async with fake_openai() as model:
        model.respond_with(answer)
        env = server_env(
            fresh_database_url,
            model,
            RUNIFOLD_MODEL_URL=model.base_url,
            RUNIFOLD_MODEL_NAME="fake-model",
            RUNIFOLD_MODEL_API_KEY=SHARED_KEY,
        )
        async with service_process("services", env, tmp_path) as process:
            await exercise_every_role(process, f"models-{uuid.uuid4().hex[:8]}")
            output = "".join(process.output)
        calls = model.chat_requests

    assert sorted({role_of(r) for r in calls}) == ["agent", "curator", "summary"]
    for call in calls:
        assert call.body["model"] == "fake-model"
        assert header(call, "Authorization") == f"Bearer {SHARED_KEY}"
    assert "deprecated" not in output
    assert SHARED_KEY not in output


async def test_the_names_used_before_still_switch_each_role_and_say_what_replaces_them(
    fresh_database_url: str, tmp_path: Path
) -> None:
    async with fake_openai() as model:
        model.respond_with(answer)
        env = server_env(
            fresh_database_url,
            model,
            RUNIFOLD_AGENT_MODEL_PROVIDER="openai",
            RUNIFOLD_OPENAI_BASE_URL=model.base_url,
            RUNIFOLD_OPENAI_API_KEY="sk-agent-secret",
            RUNIFOLD_SUMMARIZER="openai",
            RUNIFOLD_SUMMARY_MODEL_URL=model.base_url,
            RUNIFOLD_SUMMARY_MODEL="summary-model",
            RUNIFOLD_MEMORY_PROPOSER="openai",
            RUNIFOLD_MEMORY_PROPOSER_MODEL_URL=model.base_url,
            RUNIFOLD_MEMORY_PROPOSER_MODEL="curator-model",
        )
        async with service_process("services", env, tmp_path) as process:
            await exercise_every_role(process, f"models-{uuid.uuid4().hex[:8]}")
            output = "".join(process.output)
        calls = model.chat_requests

    models = {role_of(r): r.body["model"] for r in calls}
    assert models == {
        "agent": "gpt-4o-mini",
        "summary": "summary-model",
        "curator": "curator-model",
    }
    agent_calls = [r for r in calls if role_of(r) == "agent"]
    assert {header(r, "Authorization") for r in agent_calls} == {"Bearer sk-agent-secret"}
    for old, new in [
        ("RUNIFOLD_AGENT_MODEL_PROVIDER", "RUNIFOLD_AGENT_MODEL_URL"),
        ("RUNIFOLD_OPENAI_BASE_URL", "RUNIFOLD_AGENT_MODEL_URL"),
        ("RUNIFOLD_OPENAI_API_KEY", "RUNIFOLD_AGENT_MODEL_API_KEY"),
        ("RUNIFOLD_SUMMARIZER", "RUNIFOLD_SUMMARY_MODEL_URL"),
        ("RUNIFOLD_SUMMARY_MODEL", "RUNIFOLD_SUMMARY_MODEL_NAME"),
        ("RUNIFOLD_MEMORY_PROPOSER", "RUNIFOLD_CURATOR_MODEL_URL"),
        ("RUNIFOLD_MEMORY_PROPOSER_MODEL_URL", "RUNIFOLD_CURATOR_MODEL_URL"),
        ("RUNIFOLD_MEMORY_PROPOSER_MODEL", "RUNIFOLD_CURATOR_MODEL_NAME"),
    ]:
        assert output.count(f"{old} is deprecated: use {new}") == 1, (old, output)
    assert "sk-agent-secret" not in output
