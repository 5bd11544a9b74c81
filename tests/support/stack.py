"""The whole system in one real gRPC server (all-in-one addressing) for end-to-end tests.

Every service runs for real: TranscriptService and SummaryService (with its
background workers and the offline summarizer) on PostgreSQL, MemoryService
with the real embedding model and Qdrant Edge, and AgentService calling an
OpenAI-compatible model, which in tests is the fake HTTP server of
tests/support/fake_openai.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from services.agent.component import AgentComponent
from services.agent.config import AgentConfig
from services.agent.model import CurationMode
from services.common import stubs
from services.common.auth import AuthSettings
from services.common.http.settings import HttpSettings
from services.common.server import Component, RunningServer, serving
from services.llm.openai import OpenAIChatModel
from services.memory.component import MemoryComponent
from services.summary.component import SummaryComponent
from services.summary.config import SummaryConfig
from services.transcript.component import TranscriptComponent
from services.transcript.config import TranscriptLimits
from tests.memory.support import memory_config
from tests.support.fake_openai import FakeOpenAI
from tests.support.settings import server_settings

if TYPE_CHECKING:
    from runifold.agent.v1.agent_service_pb2_grpc import AgentServiceAsyncStub
    from runifold.memory.v1.memory_service_pb2_grpc import MemoryServiceAsyncStub
    from runifold.summary.v1.summary_service_pb2_grpc import SummaryServiceAsyncStub
    from runifold.transcript.v1.transcript_service_pb2_grpc import TranscriptServiceAsyncStub


@dataclass
class Stack:
    """A running all-in-one server and stubs to each service."""

    running: RunningServer
    channel: grpc.aio.Channel
    model: FakeOpenAI | None

    @property
    def address(self) -> str:
        return self.running.address

    @property
    def http_url(self) -> str:
        """The HTTP port's base URL (Connect, gRPC-Web, JSON; the console when on)."""
        assert self.running.http is not None, "this stack serves no HTTP port"
        return self.running.http.url

    @property
    def transcript(self) -> TranscriptServiceAsyncStub:
        return stubs.transcript(self.channel)

    @property
    def summary(self) -> SummaryServiceAsyncStub:
        return stubs.summary(self.channel)

    @property
    def memory(self) -> MemoryServiceAsyncStub:
        return stubs.memory(self.channel)

    @property
    def agent(self) -> AgentServiceAsyncStub:
        return stubs.agent(self.channel)


# The HTTP port on an ephemeral loopback port, without the console.
HTTP_ON = HttpSettings(listen_address="127.0.0.1:0")


@asynccontextmanager
async def full_stack(
    database_url: str,
    data_dir: Path,
    model: FakeOpenAI | None,
    *,
    auth: AuthSettings | None = None,
    agent_config: AgentConfig | None = None,
    transcript_limits: TranscriptLimits | None = None,
    summary_env: dict[str, str] | None = None,
    settings: dict[str, str] | None = None,
    http: HttpSettings | None = None,
    memory: Mapping[str, object] | None = None,
    curation: bool = False,
) -> AsyncIterator[Stack]:
    """Start every service in one server; the agent's model is the fake server, or the
    offline model (what `make run` uses) when `model` is None. `http`: the HTTP port too
    (HTTP_ON: on 127.0.0.1:0). `memory`: MemoryConfig fields to change (e.g. the
    proposer). `curation`: turns that name no curation mode are curated (the all-in-one
    server's default, AUTO); off unless asked, so that the other suites' turns leave
    memory as they find it (turns with CURATION_MODE_AUTO are curated either way)."""
    config = agent_config or AgentConfig(
        chat_model=replace(AgentConfig().chat_model, timeout_s=30.0),
        curation_default=None if curation else CurationMode.OFF,
    )
    chat = (
        OpenAIChatModel(
            model.base_url, "fake-model", timeout_s=30.0, max_retries=0, purpose="agent"
        )
        if model
        else None
    )
    components: list[Component] = [
        TranscriptComponent(transcript_limits),
        SummaryComponent(
            SummaryConfig.from_env(
                {
                    "RUNIFOLD_SUMMARY_WORKERS": "1",
                    "RUNIFOLD_SUMMARY_POLL_INTERVAL_S": "0.05",
                    **(summary_env or {}),
                }
            )
        ),
        MemoryComponent(memory_config(data_dir / "index", **(memory or {}))),
        AgentComponent(config, model=chat),
    ]
    async with (
        serving(
            components,
            server_settings(**(settings or {})),
            database_url=database_url,
            extras={"all_in_one": True},
            auth=auth,
            http=http,
        ) as running,
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        yield Stack(running, channel, model)
