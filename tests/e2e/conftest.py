"""Real gRPC servers on 127.0.0.1:0 and channels to them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from runifold.transcript.v1 import transcript_service_pb2_grpc
from services.common.server import RunningServer, serving
from services.transcript.component import TranscriptComponent
from tests.conftest import server_settings


@pytest.fixture
async def transcript_server(shared_database_url: str) -> AsyncIterator[RunningServer]:
    """TranscriptService alone, on the shared database."""
    async with serving([TranscriptComponent()], server_settings(),
                       database_url=shared_database_url) as running:
        yield running


@pytest.fixture
async def channel(transcript_server: RunningServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(transcript_server.address) as ch:
        yield ch


@pytest.fixture
def transcript(channel: grpc.aio.Channel) -> transcript_service_pb2_grpc.TranscriptServiceStub:
    return transcript_service_pb2_grpc.TranscriptServiceStub(channel)
