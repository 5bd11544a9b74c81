"""Constructors of the asyncio stubs, typed, in one place.

With types-grpcio installed, mypy-protobuf's overloads give the asyncio stub
types; the health stub's published types declare no methods, so it is Any.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health_pb2_grpc

from runifold.agent.v1 import agent_service_pb2_grpc
from runifold.memory.v1 import memory_service_pb2_grpc
from runifold.summary.v1 import summary_service_pb2_grpc
from runifold.transcript.v1 import transcript_service_pb2_grpc

if TYPE_CHECKING:
    from runifold.agent.v1.agent_service_pb2_grpc import AgentServiceAsyncStub
    from runifold.memory.v1.memory_service_pb2_grpc import MemoryServiceAsyncStub
    from runifold.summary.v1.summary_service_pb2_grpc import SummaryServiceAsyncStub
    from runifold.transcript.v1.transcript_service_pb2_grpc import TranscriptServiceAsyncStub


def transcript(channel: grpc.aio.Channel) -> TranscriptServiceAsyncStub:
    """An asyncio TranscriptService stub."""
    return transcript_service_pb2_grpc.TranscriptServiceStub(channel)


def summary(channel: grpc.aio.Channel) -> SummaryServiceAsyncStub:
    """An asyncio SummaryService stub."""
    return summary_service_pb2_grpc.SummaryServiceStub(channel)


def memory(channel: grpc.aio.Channel) -> MemoryServiceAsyncStub:
    """An asyncio MemoryService stub."""
    return memory_service_pb2_grpc.MemoryServiceStub(channel)


def agent(channel: grpc.aio.Channel) -> AgentServiceAsyncStub:
    """An asyncio AgentService stub."""
    return agent_service_pb2_grpc.AgentServiceStub(channel)


def health(channel: grpc.aio.Channel) -> Any:
    """An asyncio grpc.health.v1 stub (Check, Watch)."""
    return health_pb2_grpc.HealthStub(channel)
