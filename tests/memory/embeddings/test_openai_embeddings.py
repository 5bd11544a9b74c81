"""The OpenAI-compatible embedder: batches, order, normalisation, and its failures."""

from __future__ import annotations

import json

import httpx
import pytest

from services.memory.embeddings.openai import OpenAIEmbedder
from services.memory.embeddings.protocol import EmbeddingUnavailable


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
