"""MemoryService's configuration: its defaults, and errors that name the variable."""

from __future__ import annotations

from datetime import timedelta

import pytest

from services.common.settings import SettingsError
from services.memory.config import MemoryConfig, parse_duration


def test_configuration_defaults_and_errors_name_the_variable() -> None:
    config = MemoryConfig.from_env({})
    assert config.index == "edge" and config.embeddings == "local"
    assert config.embeddings_dimension == 384 and config.default_ttl is None
    assert (config.indexers, config.indexer_claim_s) == (1, 60.0)
    assert config.index_tombstone_retention == timedelta(days=1)
    assert config.index_validity_filter and config.chat_model.offline
    assert (config.propose_max_entries, config.propose_budget.max_model_calls) == (200, 1)
    proposing = MemoryConfig.from_env(
        {
            "RUNIFOLD_MEMORY_PROPOSER": "openai",
            "RUNIFOLD_MEMORY_PROPOSER_MODEL_URL": "http://127.0.0.1:9/v1",
            "OPENAI_API_KEY": "sk-test",
            "RUNIFOLD_MEMORY_INDEX_VALIDITY_FILTER": "off",
        }
    )
    assert (proposing.chat_model.url, proposing.chat_model.api_key) == (
        "http://127.0.0.1:9/v1",
        "sk-test",
    )
    assert not proposing.index_validity_filter
    config = MemoryConfig.from_env(
        {
            "RUNIFOLD_MEMORY_DEFAULT_TTL": "30d",
            "RUNIFOLD_MEMORY_NAMESPACE_TTLS": "short=1h, forever=0",
        }
    )
    assert config.ttl_for("other") == timedelta(days=30)
    assert config.ttl_for("short") == timedelta(hours=1)
    assert config.ttl_for("forever") is None
    for env, name in (
        ({"RUNIFOLD_MEMORY_INDEX": "faiss"}, "RUNIFOLD_MEMORY_INDEX"),
        ({"RUNIFOLD_MEMORY_INDEX": "qdrant"}, "QDRANT_URL"),
        ({"RUNIFOLD_MEMORY_DEFAULT_TTL": "soon"}, "RUNIFOLD_MEMORY_DEFAULT_TTL"),
        ({"RUNIFOLD_MEMORY_NAMESPACE_TTLS": "a b=1h"}, "RUNIFOLD_MEMORY_NAMESPACE_TTLS"),
        ({"RUNIFOLD_EMBEDDINGS": "openai"}, "RUNIFOLD_EMBEDDINGS_URL"),
        ({"RUNIFOLD_MEMORY_OVERFETCH": "0"}, "RUNIFOLD_MEMORY_OVERFETCH"),
        ({"RUNIFOLD_MEMORY_INDEXERS": "65"}, "RUNIFOLD_MEMORY_INDEXERS"),
        ({"RUNIFOLD_MEMORY_INDEXER_CLAIM_S": "0.5"}, "RUNIFOLD_MEMORY_INDEXER_CLAIM_S"),
        ({"RUNIFOLD_MEMORY_PROPOSER": "gpt"}, "RUNIFOLD_MEMORY_PROPOSER"),
        ({"RUNIFOLD_MEMORY_PROPOSER_MODEL_URL": "ftp://x"}, "RUNIFOLD_MEMORY_PROPOSER_MODEL_URL"),
        (
            {"RUNIFOLD_MEMORY_INDEX_VALIDITY_FILTER": "maybe"},
            "RUNIFOLD_MEMORY_INDEX_VALIDITY_FILTER",
        ),
        ({"RUNIFOLD_MEMORY_PROPOSE_MAX_ENTRIES": "0"}, "RUNIFOLD_MEMORY_PROPOSE_MAX_ENTRIES"),
        # A tombstone must outlive the writes still in flight (10 x the claim).
        (
            {"RUNIFOLD_MEMORY_INDEX_TOMBSTONE_RETENTION": "5m"},
            "RUNIFOLD_MEMORY_INDEX_TOMBSTONE_RETENTION",
        ),
        (
            {"RUNIFOLD_MEMORY_INDEX_TOMBSTONE_RETENTION": "0"},
            "RUNIFOLD_MEMORY_INDEX_TOMBSTONE_RETENTION",
        ),
    ):
        with pytest.raises(SettingsError, match=name):
            MemoryConfig.from_env(env)
    assert parse_duration("X", "45m") == timedelta(minutes=45)
