"""The filters and vectors of both Qdrant engines, written once: the server (adapter.py,
qdrant-client) and Qdrant Edge (index/edge.py, qdrant-edge-py).

Both engines evaluate the same revision guards, query-term conditions and
pre-validity selection; only their clients spell the parts differently. Each
adapter names its client's constructors in a `Spelling`, and these functions
build the engine's objects with it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from services.memory.index.model import (
    LEXICAL_VECTOR,
    NAMESPACE_FIELD,
    REVISION_FIELD,
    VALID_FROM_FIELD,
    VALID_UNTIL_FIELD,
    IndexPoint,
    Term,
    Tombstone,
    ValidAt,
)
from services.memory.search.lexical import LexicalVector


@dataclass(frozen=True, slots=True)
class Spelling:
    """How one Qdrant client builds the parts of a filter, and a sparse vector."""

    # Filter(must=[...], must_not=[...], should=[...]).
    filter: Callable[..., Any]
    # The point with this id.
    has_id: Callable[[str], Any]
    # A numeric payload field within bounds: (key, lt=, lte=, gt=, gte=).
    field_range: Callable[..., Any]
    # A keyword payload field equal to a value: (key, value).
    match: Callable[[str, str], Any]
    # The point has the named vector.
    has_vector: Callable[[str], Any]
    # The payload field is absent or empty.
    is_empty: Callable[[str], Any]
    # A sparse vector: (indices, values).
    sparse: Callable[[list[int], list[float]], Any]


def held_older(
    spelling: Spelling,
    bounds: Sequence[tuple[str, int]],
    *,
    inclusive: bool,
    lexical: Sequence[str] = (),
) -> Any:
    """Matches an existing point of `bounds` whose revision is below its bound (at or
    below with `inclusive`): the points a conditional write may replace. The points
    named in `lexical` (writes that bring a lexical vector) may also replace a point
    at their own revision that has none (never a tombstone: it has no namespace)."""
    below = "lte" if inclusive else "lt"
    clauses: list[Any] = [
        spelling.filter(
            must=[
                spelling.has_id(pid),
                spelling.field_range(REVISION_FIELD, **{below: revision}),
            ]
        )
        for pid, revision in bounds
    ]
    filling = set(lexical)
    clauses += [
        spelling.filter(
            must=[
                spelling.has_id(pid),
                spelling.field_range(REVISION_FIELD, gte=revision, lte=revision),
            ],
            must_not=[spelling.has_vector(LEXICAL_VECTOR), spelling.is_empty(NAMESPACE_FIELD)],
        )
        for pid, revision in bounds
        if pid in filling
    ]
    return spelling.filter(should=clauses)


def upsert_guard(spelling: Spelling, checked: Sequence[tuple[uuid.UUID, IndexPoint]]) -> Any:
    """The guard of an upsert of these points (`checked_points`): each replaces an older
    revision, or its own revision without a lexical vector when it brings one."""
    return held_older(
        spelling,
        [(str(pid), p.revision) for pid, p in checked],
        inclusive=False,
        lexical=[str(pid) for pid, p in checked if p.lexical is not None],
    )


def tombstone_guard(spelling: Spelling, entries: Sequence[tuple[uuid.UUID, Tombstone]]) -> Any:
    """The guard of these tombstones (`tombstone_points`): each replaces the same or an
    older revision (an expired memory is deleted at the revision its point holds)."""
    return held_older(spelling, [(str(pid), t.revision) for pid, t in entries], inclusive=True)


def conditions(spelling: Spelling, terms: Sequence[Term | ValidAt]) -> Any:
    """A filter of every condition of the query's terms (a `Term` an exact match, a
    `ValidAt` two ranges on the valid time)."""
    must: list[Any] = []
    for term in terms:
        if isinstance(term, ValidAt):
            must += [
                spelling.field_range(VALID_FROM_FIELD, lte=term.at),
                spelling.field_range(VALID_UNTIL_FIELD, gt=term.at),
            ]
        else:
            must.append(spelling.match(term.field, term.value))
    return spelling.filter(must=must)


def before_validity(spelling: Spelling) -> Any:
    """Points written before valid time was indexed (no `valid_until`; tombstones have no
    namespace): valid always, as far as the index knows (the store's re-read decides)."""
    return spelling.filter(
        must=[spelling.is_empty(VALID_UNTIL_FIELD)],
        must_not=[spelling.is_empty(NAMESPACE_FIELD)],
    )


def point_vectors(
    spelling: Spelling, dense: Sequence[float], lexical: LexicalVector | None
) -> dict[str, Any]:
    """A point's vectors: the dense one (unnamed) and, when known, the lexical one."""
    if lexical is None:
        return {"": list(dense)}
    return {
        "": list(dense),
        LEXICAL_VECTOR: spelling.sparse(list(lexical.indices), list(lexical.values)),
    }


def query_terms(spelling: Spelling, lexical: Sequence[int]) -> Any:
    """A query's lexical term ids as a sparse vector (each term weighs 1: BM25 sums)."""
    return spelling.sparse(list(lexical), [1.0] * len(lexical))
