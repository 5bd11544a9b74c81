"""AgentService as a server component: peers to the other services and the model."""

from __future__ import annotations

import importlib

import grpc

from runifold.agent.v1 import agent_service_pb2, agent_service_pb2_grpc
from services.agent.clients import GrpcMemories, GrpcSummaries, GrpcTranscripts
from services.agent.config import AgentConfig
from services.agent.offline import OfflineChatModel
from services.agent.service import AgentService
from services.agent.servicer import AgentServicer
from services.common.llm import ChatModel
from services.common.peers import Peer, open_channel
from services.common.server import StartContext

SERVICE_NAME = agent_service_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name


def make_model(config: AgentConfig) -> ChatModel:
    """The configured chat model."""
    if config.model_provider == "openai":
        openai_chat = importlib.import_module("services.common.openai_chat")
        model: ChatModel = openai_chat.OpenAIChatModel(
            base_url=config.openai_base_url,
            model=config.model_name,
            api_key=config.openai_api_key,
            timeout_s=config.model_timeout_s,
            max_retries=config.model_max_retries,
            purpose="agent",
        )
        return model
    return OfflineChatModel(config.model_name)


class AgentComponent:
    """Hosts AgentService; it owns no data, only clients to its peers."""

    name = "agent"
    service_names = (SERVICE_NAME,)
    needs_database = False  # the orchestrator owns no data

    def __init__(self, config: AgentConfig | None = None, model: ChatModel | None = None) -> None:
        self.config = config or AgentConfig.from_env()
        self._model = model
        self.peers: list[Peer] = []
        self.service: AgentService | None = None

    def register(self, server: grpc.aio.Server) -> None:
        assert self.service is not None, "register after start"
        agent_service_pb2_grpc.add_AgentServiceServicer_to_server(
            AgentServicer(self.service), server
        )

    async def start(self, ctx: StartContext) -> None:
        def peer(name: str) -> Peer:
            made = Peer(name, open_channel(ctx.peer_address(name), ctx.auth))
            self.peers.append(made)
            return made

        self.service = AgentService(
            GrpcTranscripts(peer("transcript")),
            GrpcSummaries(peer("summary")),
            GrpcMemories(peer("memory")),
            self._model or make_model(self.config),
            self.config,
        )

    async def stop(self) -> None:
        for made in self.peers:
            await made.close()
        self.peers.clear()

    async def healthy(self) -> bool:
        return self.service is not None
