"""Automatic curation's rules (services/memory/curation/model.py): the next batch, what a
batch stores from checked proposals, the metadata of a curated memory and what it is
shown, the hourly budget's window, and the errors."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

from services.common.errors import Code
from services.memory.curation.model import (
    CONFLICT_REASONS,
    batch_range,
    budget_retry_after,
    curated_metadata,
    curation_budget_exhausted,
    curation_queue_full,
    facts_of,
    related_filter,
    window_start,
)
from services.memory.model import Memory, MemorySource
from services.memory.proposals.model import ADD, DUPLICATE, SUPERSEDE, Proposal, RelatedMemory
from services.memory.writes.model import Supersession

NOW = datetime(2026, 12, 3, 10, 30, tzinfo=UTC)
CID = uuid.uuid4()


def stored(content: str, revision: int) -> Memory:
    return Memory("ns", uuid.uuid4(), content, [], {}, revision, NOW, NOW, None)


def proposal(content: str, action: str, related: list[uuid.UUID]) -> Proposal:
    return Proposal(content, [MemorySource(CID, 3, 3, 9)], NOW, action, related, "why")


def test_a_batch_reads_the_next_entries_and_never_past_the_last() -> None:
    assert batch_range(0, 10, 4) == (1, 4)
    assert batch_range(8, 10, 4) == (9, 10)
    assert batch_range(10, 10, 4) is None
    assert batch_range(12, 10, 4) is None  # a cursor ahead (MarkCurated) reads nothing


def test_add_stores_supersede_names_the_revision_shown_duplicate_is_skipped() -> None:
    berlin = stored("The user lives in Berlin.", 3)
    related = [RelatedMemory("m1", berlin, 0.9)]
    facts, duplicates = facts_of(
        [
            proposal("The user likes jazz.", ADD, []),
            proposal("The user lives in Paris.", SUPERSEDE, [berlin.memory_id]),
            proposal("The user lives in Berlin.", DUPLICATE, [berlin.memory_id]),
        ],
        related,
    )
    assert duplicates == 1
    assert [(f.content, list(f.supersedes)) for f in facts] == [
        ("The user likes jazz.", []),
        ("The user lives in Paris.", [Supersession(berlin.memory_id, 3)]),
    ]
    # Its exact source, as read (the incarnation is the write's to drop).
    assert facts[0].sources == [MemorySource(CID, 3, 3, 9)]


def test_a_curated_memory_says_where_it_came_from_and_whose_it_is() -> None:
    assert curated_metadata(None) == {"runifold.origin": "curation"}
    assert curated_metadata("u-7") == {"runifold.origin": "curation", "user_id": "u-7"}
    assert related_filter(None) == {}
    assert related_filter("u-7") == {"user_id": "u-7"}


def test_the_budget_is_counted_by_clock_hour() -> None:
    assert window_start(NOW) == datetime(2026, 12, 3, 10, tzinfo=UTC)
    elsewhere = NOW.astimezone(timezone(timedelta(hours=5, minutes=30)))
    assert window_start(elsewhere) == datetime(2026, 12, 3, 10, tzinfo=UTC)
    assert budget_retry_after(NOW) == 1800.0
    assert budget_retry_after(datetime(2026, 12, 3, 10, 59, 59, 900000, tzinfo=UTC)) == 1.0


def test_the_refusals_say_why_and_when_to_come_back() -> None:
    full = curation_queue_full(1000, 5.0)
    assert (full.code, full.reason, full.retry_after_s) == (
        Code.RESOURCE_EXHAUSTED,
        "CURATION_QUEUE_FULL",
        5.0,
    )
    assert full.metadata == {"limit": "1000"}
    spent = curation_budget_exhausted("model_calls", 600, 1800.0)
    assert (spent.code, spent.reason, spent.retry_after_s) == (
        Code.RESOURCE_EXHAUSTED,
        "CURATION_BUDGET_EXHAUSTED",
        1800.0,
    )
    assert spent.metadata == {"kind": "model_calls", "limit": "600"}
    # What makes a batch be proposed again (a memory it supersedes changed meanwhile).
    assert "REVISION_CONFLICT" in CONFLICT_REASONS and "VALIDITY_ENDED" in CONFLICT_REASONS
