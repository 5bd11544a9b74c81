"""The reads every memory feature shares, on the in-memory store (each feature's rules:
test_*_domain.py in its folder)."""

from __future__ import annotations

import pytest

from tests.memory.cases import MemoryCases
from tests.memory.double import InMemoryMemoryStore


class TestMemoryOnMemoryStore(MemoryCases):
    @pytest.fixture
    def store(self) -> InMemoryMemoryStore:
        return InMemoryMemoryStore()
