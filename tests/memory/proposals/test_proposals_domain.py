"""ProposeMemories on the in-memory store."""

from __future__ import annotations

import pytest

from tests.memory.double import InMemoryMemoryStore
from tests.memory.proposals.cases import ProposalCases


class TestProposalsOnMemoryStore(ProposalCases):
    @pytest.fixture
    def store(self) -> InMemoryMemoryStore:
        return InMemoryMemoryStore()
