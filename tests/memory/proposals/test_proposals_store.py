"""ProposeMemories on PostgreSQL (a fresh migrated database per test)."""

from __future__ import annotations

import pytest

from services.memory.store import PostgresMemoryStore
from tests.memory.proposals.cases import ProposalCases


class TestProposalsOnPostgres(ProposalCases):
    @pytest.fixture
    def store(self, postgres_store: PostgresMemoryStore) -> PostgresMemoryStore:
        return postgres_store
