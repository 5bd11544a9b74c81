"""One all-in-one server with JWT authentication for the security suites.

Both suites share it (starting the whole stack loads the embedding model):
every service for real on PostgreSQL, Qdrant Edge and the real embedding
model; the agent's model is the fake OpenAI server. The HTTP port is on too: the
suites ask the same questions over Connect JSON.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.fake_openai import FakeOpenAI, fake_openai
from tests.support.stack import HTTP_ON, Stack, full_stack
from tests.system.security.support import AUTH


@pytest.fixture(scope="package")
async def model() -> AsyncIterator[FakeOpenAI]:
    async with fake_openai() as server:
        yield server


@pytest.fixture(scope="package")
async def stack(
    shared_database_url: str, model: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with full_stack(
        shared_database_url, tmp_path_factory.mktemp("security"), model, auth=AUTH, http=HTTP_ON
    ) as running:
        yield running
