"""The all-in-one server the client tests talk to."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.stack import Stack, full_stack


@pytest.fixture(scope="module")
async def stack(
    shared_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    """Every service in one real server, the agent on the offline model (what `make run`
    serves), one for a module's tests."""
    async with full_stack(shared_database_url, tmp_path_factory.mktemp("stack"), None) as s:
        yield s
