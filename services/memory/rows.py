"""Memories as PostgreSQL rows and back (the store and the outbox share them)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from services.memory.model import ExternalSource, Memory, MemorySource, Source


def sources_json(sources: Sequence[Source]) -> list[dict[str, object]]:
    """The stored form of sources (short keys: it is repeated in every history row): a
    transcript range is {c, f, t}, an external URI {u}."""
    return [
        {"u": s.uri}
        if isinstance(s, ExternalSource)
        else {"c": str(s.conversation_id), "f": s.from_sequence, "t": s.through_sequence}
        for s in sources
    ]


# The columns of statements.COLUMNS, in order.
COLUMN_COUNT = 14


def memory_from_row(row: Sequence[Any]) -> Memory:
    """A memory from the first COLUMN_COUNT values of a row selected with sql.COLUMNS."""
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
        valid_from_time,
        valid_until_time,
        superseded_by,
    ) = row[:COLUMN_COUNT]
    return Memory(
        namespace=namespace,
        memory_id=memory_id,
        content=content,
        sources=sources_from_json(sources),
        metadata=metadata or {},
        revision=revision,
        create_time=create_time,
        update_time=update_time,
        expire_time=expire_time,
        embedding_model=model,
        embedding_dimension=dimension,
        valid_from_time=valid_from_time,
        valid_until_time=valid_until_time,
        superseded_by=superseded_by,
    )


def sources_from_json(sources: Sequence[Mapping[str, Any]] | None) -> tuple[Source, ...]:
    """Sources as stored back to the domain's records (None: erased)."""
    return tuple(
        ExternalSource(s["u"]) if "u" in s else MemorySource(uuid.UUID(s["c"]), s["f"], s["t"])
        for s in sources or ()
    )
