"""Curation after a turn (issue 30): a committed turn whose policy (or its namespace's
default) says AUTO asks MemoryService for the curation of its conversation, in the
background; the answer never waits for the request. The rules of the policy field and
of the namespace defaults."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from prometheus_client import REGISTRY

from services.agent.component import AgentComponent
from services.agent.config import AgentConfig, parse_curation_namespaces
from services.agent.model import CurationMode, Turn
from services.agent.service import AgentService
from services.common.domain import Budget, Message, Role
from services.common.errors import Code, DomainError, StoreUnavailable
from services.common.server import StartContext
from services.common.settings import SettingsError
from tests.agent.fakes import FakeMemories, FakeSummaries, FakeTranscripts, ScriptedModel, new_id
from tests.support.settings import server_settings
from tests.support.waiting import holds, wait_for

NS = "tenant-c"


class HeldMemories(FakeMemories):
    """RequestCuration answers only once `release` is set (or fails as told)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.failures: list[DomainError] = []

    async def request_curation(self, namespace: str, conversation_id: str) -> None:
        await self.release.wait()
        if self.failures:
            raise self.failures.pop(0)
        await super().request_curation(namespace, conversation_id)


def world(config: AgentConfig | None = None) -> tuple[AgentService, HeldMemories]:
    transcripts = FakeTranscripts()
    memories = HeldMemories()
    agent = AgentService(
        transcripts,
        FakeSummaries(transcripts),
        memories,
        ScriptedModel(),
        config or AgentConfig(curation_default=CurationMode.OFF),
    )
    return agent, memories


def turn(agent: AgentService, cid: str, curation: int = 0, namespace: str = NS) -> Turn:
    return Turn(
        namespace=namespace,
        conversation_id=cid,
        input=[Message(Role.USER, "I live in Berlin.")],
        turn_id=new_id(),
        policy=agent.policy(0, 0, 0, 0, 0, curation, namespace),
        budget=agent.budget(Budget()),
        create_if_missing=True,
    )


def requests(outcome: str) -> float:
    value = REGISTRY.get_sample_value(
        "runifold_agent_curation_requests_total", {"outcome": outcome}
    )
    return value or 0.0


async def test_an_auto_turn_asks_for_curation_without_waiting_for_the_answer() -> None:
    agent, memories = world()
    cid = new_id()
    before = requests("requested")
    result = await agent.run(turn(agent, cid, CurationMode.AUTO))
    # The turn answered while its curation request is still held.
    assert result.last_sequence == 2
    assert agent.curation.in_flight == 1 and memories.curation_requests == []
    memories.release.set()
    await wait_for(holds(lambda: agent.curation.in_flight == 0))
    assert memories.curation_requests == [(NS, cid)]
    assert requests("requested") == before + 1


async def test_a_turn_with_curation_off_or_a_default_off_asks_nothing() -> None:
    agent, memories = world()
    memories.release.set()
    await agent.run(turn(agent, new_id(), CurationMode.OFF))
    await agent.run(turn(agent, new_id()))  # unspecified: the namespace's default, off
    assert agent.curation.in_flight == 0 and memories.curation_requests == []


async def test_the_namespace_default_decides_a_turn_that_names_none() -> None:
    config = AgentConfig(
        curation_default=CurationMode.OFF, curation_namespaces={"auto-ns": CurationMode.AUTO}
    )
    agent, memories = world(config)
    memories.release.set()
    cid = new_id()
    await agent.run(turn(agent, cid, namespace="auto-ns"))
    await agent.run(turn(agent, new_id()))
    await wait_for(holds(lambda: agent.curation.in_flight == 0))
    assert memories.curation_requests == [("auto-ns", cid)]
    # A turn's own mode wins over the default.
    assert agent.policy(0, 0, 0, 0, 0, CurationMode.OFF, "auto-ns").curation is CurationMode.OFF
    with pytest.raises(DomainError) as unknown:
        agent.policy(0, 0, 0, 0, 0, 7, NS)
    assert (unknown.value.reason, unknown.value.field) == (
        "INVALID_CURATION_MODE",
        "policy.curation",
    )


async def test_a_request_that_cannot_be_sent_is_counted_and_let_go() -> None:
    agent, memories = world()
    memories.failures = [StoreUnavailable("memory")] * 3
    failed = requests("failed")
    await agent.run(turn(agent, new_id(), CurationMode.AUTO))
    memories.release.set()
    await wait_for(holds(lambda: agent.curation.in_flight == 0), timeout=10)
    assert memories.curation_requests == [] and requests("failed") == failed + 1
    # A full queue is a refusal (the namespace's jobs already cover its backlog).
    memories.failures = [
        DomainError(Code.RESOURCE_EXHAUSTED, "CURATION_QUEUE_FULL", "full", retry_after_s=5)
    ]
    refused = requests("refused")
    await agent.run(turn(agent, new_id(), CurationMode.AUTO))
    await wait_for(holds(lambda: agent.curation.in_flight == 0))
    assert requests("refused") == refused + 1


async def test_requests_beyond_the_bound_in_flight_are_dropped() -> None:
    agent, memories = world(
        AgentConfig(curation_default=CurationMode.OFF, curation_max_in_flight=2)
    )
    dropped = requests("dropped")
    for _ in range(3):
        await agent.run(turn(agent, new_id(), CurationMode.AUTO))
    assert agent.curation.in_flight == 2 and requests("dropped") == dropped + 1
    memories.release.set()
    await agent.curation.close()
    assert len(memories.curation_requests) == 2


def test_the_curation_settings() -> None:
    assert AgentConfig.from_env({}).curation_default is None  # decided at start
    assert AgentConfig.from_env({"RUNIFOLD_CURATION": "off"}).curation_default is CurationMode.OFF
    assert parse_curation_namespaces("X", "a=auto, b.c=off,") == {
        "a": CurationMode.AUTO,
        "b.c": CurationMode.OFF,
    }
    for bad in ("a", "a=on", "bad ns=auto"):
        with pytest.raises(SettingsError, match="X"):
            parse_curation_namespaces("X", bad)
    with pytest.raises(SettingsError, match="RUNIFOLD_CURATION"):
        AgentConfig.from_env({"RUNIFOLD_CURATION": "sometimes"})


@pytest.mark.parametrize(("all_in_one", "expected"), [(True, CurationMode.AUTO), (False, None)])
async def test_the_all_in_one_server_curates_by_default_and_a_service_alone_does_not(
    all_in_one: bool, expected: CurationMode | None
) -> None:
    settings = replace(
        server_settings(),
        transcript_service_addr="127.0.0.1:9",
        summary_service_addr="127.0.0.1:9",
        memory_service_addr="127.0.0.1:9",
    )
    for configured in (None, CurationMode.OFF, CurationMode.AUTO):
        component = AgentComponent(AgentConfig(curation_default=configured))
        await component.start(
            StartContext(settings, "127.0.0.1:0", None, {"all_in_one": all_in_one})
        )
        try:
            decided = component.config.curation_default
            assert decided is (configured or expected or CurationMode.OFF)
        finally:
            await component.stop()
