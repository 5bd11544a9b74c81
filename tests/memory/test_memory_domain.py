"""The memory domain on the in-memory store; configuration; the OpenAI-compatible embedder."""

from __future__ import annotations

import json
from datetime import timedelta

import httpx
import pytest

from services.common.settings import SettingsError
from services.memory.config import MemoryConfig, parse_duration
from services.memory.embeddings.openai import OpenAIEmbedder
from services.memory.embeddings.protocol import EmbeddingUnavailable
from services.memory.index.model import collection_name, point_id
from tests.memory.cases import MemoryCases
from tests.memory.double import InMemoryMemoryStore
from tests.memory.proposals.cases import EvolvingMemoryCases


class TestInMemoryStore(MemoryCases):
    @pytest.fixture
    def store(self) -> InMemoryMemoryStore:
        return InMemoryMemoryStore()


class TestEvolvingInMemoryStore(EvolvingMemoryCases):
    @pytest.fixture
    def store(self) -> InMemoryMemoryStore:
        return InMemoryMemoryStore()


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


def test_collections_and_points_are_per_model_and_namespace() -> None:
    assert collection_name("sentence-transformers/all-MiniLM-L6-v2", 384) == (
        "runifold_memory_sentence_transformers_all_minilm_l6_v2_384"
    )
    import uuid

    mid = uuid.uuid4()
    assert point_id("a", mid) != point_id("b", mid)
    assert point_id("a", mid) == point_id("a", mid)


async def test_openai_embedder_batches_orders_and_normalises() -> None:
    requests: list[dict[str, object]] = []
    # Each input points a different way and has length 5, so a mix-up of the
    # order shows and so does a missing normalisation.
    raw = {"a": [3.0, 4.0, 0.0], "bb": [0.0, 3.0, 4.0], "ccc": [4.0, 0.0, 3.0]}

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        requests.append(body)
        assert request.headers["authorization"] == "Bearer k"
        assert request.url.path == "/v1/embeddings"
        data = [{"index": i, "embedding": raw[text]} for i, text in enumerate(body["input"])]
        return httpx.Response(
            200, json={"data": list(reversed(data)), "usage": {"prompt_tokens": 3}}
        )

    embedder = OpenAIEmbedder(
        "http://embeddings.test/v1",
        "text-embedding-3-small",
        3,
        api_key="k",
        batch_size=2,
        transport=httpx.MockTransport(handler),
    )
    vectors = await embedder.embed(["a", "bb", "ccc"])
    assert vectors == [[0.6, 0.8, 0.0], [0.0, 0.6, 0.8], [0.8, 0.0, 0.6]]
    assert [r["input"] for r in requests] == [["a", "bb"], ["ccc"]]
    assert all(r["model"] == "text-embedding-3-small" for r in requests)
    await embedder.close()


async def test_openai_embedder_failures_are_unavailable() -> None:
    for response in (
        httpx.Response(503, json={}),
        httpx.Response(200, json={"data": [{"index": 0, "embedding": [1.0]}]}),  # wrong size
        httpx.Response(200, text="not json"),
    ):
        embedder = OpenAIEmbedder(
            "http://embeddings.test/v1",
            "m",
            3,
            transport=httpx.MockTransport(lambda _, r=response: r),
        )
        with pytest.raises(EmbeddingUnavailable):
            await embedder.embed(["a"])
        await embedder.close()
