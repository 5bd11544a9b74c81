"""What the memory service needs from an embedding model: the Embedder interface, its
vectors, and the error of a model that cannot answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from services.common.errors import StoreUnavailable

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
