"""The gRPC service name each Runifold service answers health checks for."""

from __future__ import annotations

from runifold.agent.v1 import agent_service_pb2
from runifold.memory.v1 import memory_service_pb2
from runifold.summary.v1 import summary_service_pb2
from runifold.transcript.v1 import transcript_service_pb2

GRPC_NAMES = {
    "transcript": transcript_service_pb2.DESCRIPTOR.services_by_name["TranscriptService"].full_name,
    "summary": summary_service_pb2.DESCRIPTOR.services_by_name["SummaryService"].full_name,
    "memory": memory_service_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name,
    "agent": agent_service_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
}
