"""Real gRPC servers on 127.0.0.1:0 and channels to them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc
import pytest

if TYPE_CHECKING:
    from runifold.transcript.v1.transcript_service_pb2_grpc import TranscriptServiceAsyncStub

from services.common import stubs
from services.common.server import RunningServer, serving
from services.transcript.component import TranscriptComponent
from tests.conftest import server_settings


@pytest.fixture
async def transcript_server(shared_database_url: str) -> AsyncIterator[RunningServer]:
    """TranscriptService alone, on the shared database."""
    async with serving(
        [TranscriptComponent()], server_settings(), database_url=shared_database_url
    ) as running:
        yield running


@pytest.fixture
async def channel(transcript_server: RunningServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(transcript_server.address) as ch:
        yield ch


@pytest.fixture
def transcript(channel: grpc.aio.Channel) -> TranscriptServiceAsyncStub:
    return stubs.transcript(channel)
