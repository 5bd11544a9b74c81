"""An agent process killed, or paused, in the middle of a turn.

TranscriptService (with SummaryService) runs in the test's process; two
AgentService replicas run as their own processes (`python -m services.agent`),
both calling the fake OpenAI server, which holds the first turn's model call.

- SIGKILL of the agent holding the turn: its lease lapses and the next turn,
  through the other replica, proceeds (REJECT refuses it until then).
- SIGSTOP instead: the other replica's turn commits once the lease lapsed; when the
  paused agent resumes and its model call returns, its append is refused by its
  stale fencing token (TURN_LEASE_LOST) and its caller gets the uncommitted outcome back.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs
from services.common.server import Component, RunningServer, serving
from services.summary.component import SummaryComponent
from services.summary.config import SummaryConfig
from services.transcript import metrics
from services.transcript.component import TranscriptComponent
from tests.support.fake_openai import FakeOpenAI, FakeReply, fake_openai
from tests.support.grpc_calls import reason, status_detail, user
from tests.support.process import ServiceProcess, service_process
from tests.support.settings import server_settings
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

LEASE_TTL_S = "2"


@contextlib.asynccontextmanager
async def services(database_url: str) -> AsyncIterator[RunningServer]:
    components: list[Component] = [
        TranscriptComponent(),
        SummaryComponent(SummaryConfig.from_env({"RUNIFOLD_SUMMARY_WORKERS": "0"})),
    ]
    async with serving(
        components, server_settings(), database_url=database_url, extras={"all_in_one": True}
    ) as running:
        yield running


@contextlib.asynccontextmanager
async def agent(
    running: RunningServer, model: FakeOpenAI, data_dir: Path
) -> AsyncIterator[ServiceProcess]:
    env = {
        "TRANSCRIPT_SERVICE_ADDR": running.address,
        "SUMMARY_SERVICE_ADDR": running.address,
        "MEMORY_SERVICE_ADDR": "127.0.0.1:9",  # turns here use no memory
        "RUNIFOLD_AGENT_MODEL_URL": model.base_url,
        "RUNIFOLD_AGENT_MODEL_NAME": "fake-model",
        "RUNIFOLD_AGENT_MODEL_MAX_RETRIES": "0",
        "RUNIFOLD_AGENT_TURN_LEASE_TTL_S": LEASE_TTL_S,
    }
    async with service_process("services.agent", env, data_dir) as process:
        yield process


class Held:
    """The fake model holds the answer to the first user text until `release`."""

    def __init__(self, model: FakeOpenAI, held_text: str) -> None:
        self.held_text = held_text
        self.release = asyncio.Event()
        model.respond_with(self._respond)
        self.model = model

    async def _respond(self, body: Any) -> FakeReply:
        text = body["messages"][-1]["content"]
        if text == self.held_text:
            await asyncio.wait_for(self.release.wait(), 60)
        return FakeReply(text=f"answer to {text}", usage=(10, 3))

    async def asked(self) -> bool:
        return any(r.messages[-1]["content"] == self.held_text for r in self.model.chat_requests)


def turn(cid: str, namespace: str, text: str) -> agent_pb.RunConversationRequest:
    return agent_pb.RunConversationRequest(
        namespace=namespace,
        conversation_id=cid,
        input=[user(text)],
        turn_id=f"turn-{text.replace(' ', '-')}",
        concurrency=agent_pb.CONCURRENCY_MODE_REJECT,
    )


async def until_it_runs(
    stub: Any, request: agent_pb.RunConversationRequest
) -> agent_pb.RunConversationResponse:
    """The turn, retried while the conversation is busy (the lapsing lease), as a REJECT
    client would."""
    answered: list[agent_pb.RunConversationResponse] = []

    async def ran() -> bool:
        try:
            answered.append(await stub.RunConversation(request, timeout=30))
        except grpc.aio.AioRpcError as error:
            assert reason(error) == "CONVERSATION_BUSY", error
            return False
        return True

    await wait_for(ran, timeout=30, interval=0.2)
    return answered[0]


async def transcript_texts(running: RunningServer, namespace: str, cid: str) -> list[str]:
    async with grpc.aio.insecure_channel(running.address) as channel:
        page = await stubs.transcript(channel).ListEntries(
            pb.ListEntriesRequest(namespace=namespace, conversation_id=cid)
        )
    return [e.message.text for e in page.entries]


async def new_conversation(running: RunningServer, namespace: str) -> str:
    async with grpc.aio.insecure_channel(running.address) as channel:
        created = await stubs.transcript(channel).CreateConversation(
            pb.CreateConversationRequest(namespace=namespace)
        )
    return created.conversation.conversation_id


async def test_a_killed_agents_lease_lapses_and_the_next_turn_proceeds(
    fresh_database_url: str, tmp_path: Path, namespace: str
) -> None:
    async with fake_openai() as model, services(fresh_database_url) as running:
        held = Held(model, "first words")
        cid = await new_conversation(running, namespace)
        expiries = metrics.TURN_LEASE_EXPIRIES._value.get()
        async with (
            agent(running, model, tmp_path / "a") as doomed,
            agent(running, model, tmp_path / "b") as survivor,
            grpc.aio.insecure_channel(doomed.address) as to_doomed,
            grpc.aio.insecure_channel(survivor.address) as to_survivor,
        ):
            first = asyncio.ensure_future(
                stubs.agent(to_doomed).RunConversation(turn(cid, namespace, "first words"))
            )
            await wait_for(held.asked)
            other = stubs.agent(to_survivor)
            with pytest.raises(grpc.aio.AioRpcError) as busy:
                await other.RunConversation(turn(cid, namespace, "second words"), timeout=30)
            assert reason(busy.value) == "CONVERSATION_BUSY"

            doomed.process.kill()  # SIGKILL mid-turn: no release, no renewal
            await doomed.process.wait()
            with pytest.raises(grpc.aio.AioRpcError):
                await first
            result = await until_it_runs(other, turn(cid, namespace, "second words"))
        held.release.set()
        assert result.conversation_version == 1
        assert await transcript_texts(running, namespace, cid) == [
            "second words",
            "answer to second words",
        ]
        assert metrics.TURN_LEASE_EXPIRIES._value.get() == expiries + 1


async def test_a_paused_agent_resumes_and_its_late_append_is_refused_by_its_token(
    fresh_database_url: str, tmp_path: Path, namespace: str
) -> None:
    async with fake_openai() as model, services(fresh_database_url) as running:
        held = Held(model, "slow words")
        cid = await new_conversation(running, namespace)
        refusals = metrics.TURN_FENCING_TOKEN_REFUSALS._value.get()
        async with (
            agent(running, model, tmp_path / "a") as paused,
            agent(running, model, tmp_path / "b") as other_agent,
            grpc.aio.insecure_channel(paused.address) as to_paused,
            grpc.aio.insecure_channel(other_agent.address) as to_other,
        ):
            late = asyncio.ensure_future(
                stubs.agent(to_paused).RunConversation(
                    turn(cid, namespace, "slow words"), timeout=90
                )
            )
            await wait_for(held.asked)
            paused.process.send_signal(signal.SIGSTOP)  # a stop-the-world pause
            try:
                result = await until_it_runs(
                    stubs.agent(to_other), turn(cid, namespace, "quick words")
                )
                held.release.set()  # the paused turn's model answer is waiting for it
            finally:
                paused.process.send_signal(signal.SIGCONT)
            with pytest.raises(grpc.aio.AioRpcError) as lost:
                await late
        assert result.conversation_version == 1
        assert lost.value.code() == grpc.StatusCode.ABORTED
        assert reason(lost.value) == "TURN_LEASE_LOST"
        detail = status_detail(lost.value, agent_pb.TurnConflict)
        assert detail.outcome.output[0].text == "answer to slow words"
        assert await transcript_texts(running, namespace, cid) == [
            "quick words",
            "answer to quick words",
        ]
        assert metrics.TURN_FENCING_TOKEN_REFUSALS._value.get() == refusals + 1


async def test_a_turn_paused_in_its_model_call_is_interrupted_not_run_again(
    fresh_database_url: str, tmp_path: Path, namespace: str
) -> None:
    """The agent running a turn stops (SIGSTOP) while the model answers, past its lease:
    a repeat of the turn id through the other agent is not granted the lease (which would
    call the model a second time): it is ABORTED / TURN_INTERRUPTED, and the model was
    called once. The paused agent, resumed, cannot commit either."""
    async with fake_openai() as model, services(fresh_database_url) as running:
        held = Held(model, "interrupted words")
        cid = await new_conversation(running, namespace)
        request = turn(cid, namespace, "interrupted words")
        async with (
            agent(running, model, tmp_path / "a") as paused,
            agent(running, model, tmp_path / "b") as other_agent,
            grpc.aio.insecure_channel(paused.address) as to_paused,
            grpc.aio.insecure_channel(other_agent.address) as to_other,
        ):
            late = asyncio.ensure_future(
                stubs.agent(to_paused).RunConversation(request, timeout=90)
            )
            await wait_for(held.asked)
            paused.process.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(grpc.aio.AioRpcError) as repeated:
                    await stubs.agent(to_other).RunConversation(request, timeout=60)
            finally:
                held.release.set()
                paused.process.send_signal(signal.SIGCONT)
            with pytest.raises(grpc.aio.AioRpcError) as lost:
                await late
            # A repeat after that gets the same answer, without a model call either.
            with pytest.raises(grpc.aio.AioRpcError) as again:
                await stubs.agent(to_other).RunConversation(request, timeout=60)
        assert repeated.value.code() == grpc.StatusCode.ABORTED
        assert reason(repeated.value) == "TURN_INTERRUPTED"
        assert reason(again.value) == "TURN_INTERRUPTED"
        assert reason(lost.value) == "TURN_LEASE_LOST"
        calls = [r for r in model.chat_requests if r.messages[-1]["content"] == "interrupted words"]
        assert len(calls) == 1
        assert await transcript_texts(running, namespace, cid) == []
