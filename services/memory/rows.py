"""Memories as PostgreSQL rows and back (the store and the outbox share them)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from services.memory.model import Memory, MemorySource


def sources_json(sources: Sequence[MemorySource]) -> list[dict[str, object]]:
    """The stored form of sources (short keys: it is repeated in every history row)."""
    return [
        {"c": str(s.conversation_id), "f": s.from_sequence, "t": s.through_sequence}
        for s in sources
    ]


def memory_from_row(row: Sequence[Any]) -> Memory:
    (
        namespace,
        memory_id,
        content,
        sources,
        metadata,
        revision,
        create_time,
        update_time,
        expire_time,
        model,
        dimension,
    ) = row[:11]
    return Memory(
        namespace=namespace,
        memory_id=memory_id,
        content=content,
        sources=tuple(MemorySource(uuid.UUID(s["c"]), s["f"], s["t"]) for s in sources),
        metadata=metadata or {},
        revision=revision,
        create_time=create_time,
        update_time=update_time,
        expire_time=expire_time,
        embedding_model=model,
        embedding_dimension=dimension,
    )
