"""Checkpoints on PostgreSQL."""

from __future__ import annotations

import pytest

from services.common.postgres.pool import Database
from services.transcript.store import PostgresTranscriptStore, TranscriptStore
from tests.transcript.checkpoints.cases import CheckpointCases


class TestCheckpointsOnPostgres(CheckpointCases):
    @pytest.fixture
    def store(self, database: Database) -> TranscriptStore:
        return PostgresTranscriptStore(database)
