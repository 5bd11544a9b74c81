"""The OpenAI-compatible `/v1/embeddings` endpoint behind the Embedder interface of
services/memory/embeddings/protocol.py (OpenAI, vLLM, Ollama, LiteLLM...): batched by
`RUNIFOLD_EMBEDDINGS_BATCH`, behind a bounded, deadline-aware slot queue."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import httpx

from services.common.admission import namespace_var
from services.common.deadlines import remaining
from services.common.shedding import SlotQueue
from services.llm import metrics
from services.memory.embeddings.protocol import EmbeddingUnavailable, Vector

log = logging.getLogger(__name__)


class OpenAIEmbedder:
    """An OpenAI-compatible `/v1/embeddings` endpoint (OpenAI, vLLM, Ollama, LiteLLM...)."""

    provider = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        dimension: int,
        *,
        api_key: str = "",
        timeout_s: float = 30.0,
        batch_size: int = 64,
        transport: httpx.AsyncBaseTransport | None = None,
        max_concurrent: int = 16,
        max_queued: int = 256,
    ) -> None:
        self._model = model
        self._dimension = dimension
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # The slot queue in front of the endpoint (bounded, deadline-aware);
        # the pool never makes a request wait behind it.
        self._slots = SlotQueue("embeddings", max_concurrent, max_queued)
        self._client = httpx.AsyncClient(
            base_url=base_url,
            headers=headers,
            timeout=timeout_s,
            transport=transport,
            limits=httpx.Limits(max_connections=max_concurrent),
        )
        self._seconds = metrics.MODEL_SECONDS.labels("embedding", self.provider)
        self._errors = metrics.MODEL_ERRORS.labels("embedding", self.provider)
        self._tokens_in = metrics.MODEL_TOKENS.labels("embedding", self.provider, "input")

    @property
    def model(self) -> str:
        return self._model

    @property
    def dimension(self) -> int:
        return self._dimension

    async def start(self) -> None:
        """Nothing to load: the endpoint is reached on demand."""

    async def embed(self, texts: Sequence[str]) -> list[Vector]:
        vectors: list[Vector] = []
        for start in range(0, len(texts), self.batch_size):
            # A wait for the endpoint ends with the caller's deadline.
            async with self._slots.slot(remaining(self.timeout_s), namespace_var.get() or ""):
                vectors += await self._embed_batch(texts[start : start + self.batch_size])
        return vectors

    async def _embed_batch(self, texts: Sequence[str]) -> list[Vector]:
        started = time.perf_counter()
        try:
            response = await self._client.post(
                "/embeddings", json={"model": self._model, "input": list(texts)}
            )
            response.raise_for_status()
            document = response.json()
            data = sorted(document["data"], key=lambda item: item["index"])
            vectors = [_normalise([float(x) for x in item["embedding"]]) for item in data]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            self._errors.inc()
            log.warning("embedding endpoint failed", extra={"error": type(exc).__name__})
            raise EmbeddingUnavailable() from exc
        if len(vectors) != len(texts) or any(len(v) != self._dimension for v in vectors):
            self._errors.inc()
            log.warning(
                "embedding endpoint answered the wrong shape",
                extra={"expected_dimension": self._dimension},
            )
            raise EmbeddingUnavailable()
        self._seconds.observe(time.perf_counter() - started)
        usage = document.get("usage") or {}
        if isinstance(usage.get("prompt_tokens"), int):
            self._tokens_in.inc(usage["prompt_tokens"])
        return vectors

    async def close(self) -> None:
        await self._client.aclose()


def _normalise(vector: Vector) -> Vector:
    norm = sum(x * x for x in vector) ** 0.5
    return [x / norm for x in vector] if norm else vector
