"""The summaries of the summary store on PostgreSQL (a database of its own per test)."""

from __future__ import annotations

import pytest

from services.common.postgres.pool import Database
from services.summary.store import PostgresSummaryStore, SummaryStore
from tests.summary.cases import SummaryStoreCases


class TestSummaryStoreOnPostgres(SummaryStoreCases):
    @pytest.fixture
    def store(self, isolated: Database) -> SummaryStore:
        return PostgresSummaryStore(isolated, history_limit=3)
