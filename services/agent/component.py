"""AgentService as a server component: clients of the other services, and the model."""

from __future__ import annotations

from dataclasses import replace

import grpc

from runifold.agent.v1 import agent_service_pb2, agent_service_pb2_grpc
from services.agent.config import AgentConfig
from services.agent.model import CurationMode
from services.agent.offline import OfflineChatModel
from services.agent.remote import GrpcMemories, GrpcSummaries, GrpcTranscripts
from services.agent.service import AgentService
from services.agent.servicer import AgentServicer
from services.agent.turn.inputs import request_bytes
from services.common.channels import Peer, open_channel
from services.common.server import StartContext
from services.llm.model import ChatModel
from services.llm.openai import OpenAIChatModel

SERVICE_NAME = agent_service_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name


def make_model(config: AgentConfig) -> tuple[ChatModel, OpenAIChatModel | None]:
    """The configured chat model (and the HTTP client to close, if any)."""
    settings = config.chat_model
    if settings.offline:
        return OfflineChatModel(settings.name), None
    model = OpenAIChatModel.from_settings(settings, purpose="agent")
    return model, model


class AgentComponent:
    """Hosts AgentService; it owns no data, only clients to its peers."""

    name = "agent"
    service_names = (SERVICE_NAME,)
    needs_database = False  # the orchestrator owns no data

    def __init__(self, config: AgentConfig | None = None, model: ChatModel | None = None) -> None:
        self.config = config or AgentConfig.from_env()
        self._model = model  # given by the caller, who closes it
        self._owned: OpenAIChatModel | None = None
        self.peers: list[Peer] = []
        self.service: AgentService | None = None

    @property
    def max_request_bytes(self) -> int:
        """The largest request the limits allow (a turn): the transport cap."""
        return request_bytes(self.config)

    def register(self, server: grpc.aio.Server) -> None:
        assert self.service is not None, "register after start"
        agent_service_pb2_grpc.add_AgentServiceServicer_to_server(
            AgentServicer(self.service), server
        )

    async def start(self, ctx: StartContext) -> None:
        if self.config.curation_default is None:
            # Unset: the all-in-one server curates (a newcomer sees memory fill), a
            # service deployed alone does not unless told (RUNIFOLD_CURATION=auto).
            mode = CurationMode.AUTO if ctx.extras.get("all_in_one") else CurationMode.OFF
            self.config = replace(self.config, curation_default=mode)

        def peer(name: str) -> Peer:
            made = Peer(name, open_channel(ctx.peer_address(name), ctx.auth))
            self.peers.append(made)
            return made

        model = self._model
        if model is None:
            model, self._owned = make_model(self.config)
        self.service = AgentService(
            GrpcTranscripts(peer("transcript"), wait_s=self.config.turn_wait_max_s),
            GrpcSummaries(peer("summary")),
            GrpcMemories(peer("memory")),
            model,
            self.config,
        )

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.curation.close()
        if self._owned is not None:
            await self._owned.aclose()
            self._owned = None
        for made in self.peers:
            await made.close()
        self.peers.clear()

    async def healthy(self) -> bool:
        return self.service is not None
