"""The summaries of the summary store (commits that only move forward, history,
compare-and-swap, incarnations, purge), run against every SummaryStore:
test_summary_domain.py on the in-memory store, test_summary_store.py on PostgreSQL. Both
stores must give the domain the same guarantees (the job queue's cases: jobs/cases.py).
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import pytest

from services.common.errors import Code, DomainError
from services.summary.model import NewSummary
from services.summary.store import SummaryStore
from tests.summary.support import (
    new_job,
)


class SummaryStoreCases:
    """Subclasses provide a `store` fixture (a SummaryStore with history_limit 3)."""

    async def test_commits_only_move_forward(self, store: SummaryStore, namespace: str) -> None:
        cid = uuid.uuid4()
        first = await store.commit_summary(NewSummary(namespace, cid, "one", 4, None))
        assert first.written and first.summary.revision == 1
        second = await store.commit_summary(NewSummary(namespace, cid, "two", 9, 4))
        assert second.summary.revision == 2 and second.summary.through_sequence == 9
        with pytest.raises(DomainError) as stale:
            await store.commit_summary(NewSummary(namespace, cid, "older", 6, None))
        assert stale.value.reason == "SUMMARY_NOT_NEWER"
        assert stale.value.code is Code.FAILED_PRECONDITION
        with pytest.raises(DomainError) as conflict:
            await store.commit_summary(NewSummary(namespace, cid, "three", 12, 4))
        assert conflict.value.code is Code.ABORTED
        assert conflict.value.reason == "SUMMARY_CONFLICT"
        assert conflict.value.metadata["current_through_sequence"] == "9"
        replay = await store.commit_summary(NewSummary(namespace, cid, "two", 9, 4))
        assert not replay.written and replay.summary.revision == 2
        current = await store.get_summary(namespace, cid)
        assert current is not None and (current.text, current.through_sequence) == ("two", 9)
        assert await store.get_summary("another-namespace", cid) is None

    async def test_history_keeps_the_newest_replaced_summaries(
        self, store: SummaryStore, namespace: str
    ) -> None:
        cid = uuid.uuid4()
        for through in range(1, 7):
            await store.commit_summary(NewSummary(namespace, cid, f"s{through}", through, None))
        history = await store.summary_history(namespace, cid)
        assert [(s.revision, s.text) for s in history] == [(3, "s3"), (4, "s4"), (5, "s5")]

    async def test_racing_commits_never_regress(self, store: SummaryStore, namespace: str) -> None:
        cid = uuid.uuid4()
        throughs = list(range(1, 41))

        async def commit(through: int) -> None:
            try:
                await store.commit_summary(NewSummary(namespace, cid, f"s{through}", through, None))
            except DomainError as error:
                assert error.reason == "SUMMARY_NOT_NEWER"

        await asyncio.gather(*(commit(t) for t in reversed(throughs)))
        current = await store.get_summary(namespace, cid)
        assert current is not None and current.through_sequence == 40
        revisions = [*await store.summary_history(namespace, cid), current]
        assert [s.revision for s in revisions] == sorted(s.revision for s in revisions)
        sequence = [s.through_sequence for s in revisions]
        assert sequence == sorted(set(sequence))

    async def test_racing_compare_and_swap_has_one_winner(
        self, store: SummaryStore, namespace: str
    ) -> None:
        cid = uuid.uuid4()

        async def commit(i: int) -> bool:
            try:
                await store.commit_summary(NewSummary(namespace, cid, f"w{i}", 10 + i, 0))
                return True
            except DomainError as error:
                assert error.reason == "SUMMARY_CONFLICT"
                return False

        wins = await asyncio.gather(*(commit(i) for i in range(16)))
        assert sum(wins) == 1
        current = await store.get_summary(namespace, cid)
        assert current is not None and current.revision == 1

    async def test_an_erased_incarnation_refuses_commits_and_jobs(
        self, store: SummaryStore, namespace: str
    ) -> None:
        cid = uuid.uuid4()
        await store.commit_summary(NewSummary(namespace, cid, "a", 1, None, incarnation=7))
        assert (await store.erase_conversation(namespace, cid, 7)).rows == 1
        with pytest.raises(DomainError) as commit:
            await store.commit_summary(NewSummary(namespace, cid, "late", 2, 0, incarnation=7))
        assert (commit.value.code, commit.value.reason) == (Code.NOT_FOUND, "CONVERSATION_ERASED")
        with pytest.raises(DomainError) as job:
            await store.enqueue(replace(new_job(namespace, cid), incarnation=7))
        assert job.value.reason == "CONVERSATION_ERASED"
        assert await store.get_summary(namespace, cid) is None
        # The id made again (another incarnation) is a conversation like any other.
        made = await store.commit_summary(NewSummary(namespace, cid, "new", 1, 0, incarnation=8))
        assert made.summary.incarnation == 8 and made.summary.revision == 1
        _, created = await store.enqueue(replace(new_job(namespace, cid), incarnation=8))
        assert created

    async def test_a_summary_of_an_earlier_incarnation_is_replaced_not_extended(
        self, store: SummaryStore, namespace: str
    ) -> None:
        cid = uuid.uuid4()
        await store.commit_summary(NewSummary(namespace, cid, "old a", 5, None, incarnation=1))
        await store.commit_summary(NewSummary(namespace, cid, "old b", 9, None, incarnation=1))
        # Shorter than the old one, with a compare-and-swap on "no summary": accepted.
        fresh = await store.commit_summary(NewSummary(namespace, cid, "new", 2, 0, incarnation=2))
        assert (fresh.summary.through_sequence, fresh.summary.revision) == (2, 1)
        assert await store.summary_history(namespace, cid) == []

    async def test_an_erasure_retried_reports_what_every_call_erased(
        self, store: SummaryStore, namespace: str
    ) -> None:
        # The counts of an erasure receipt: the tombstone adds up the calls of one
        # incarnation's erasure, so a retry (the first reply lost) reports them all.
        cid = uuid.uuid4()
        await store.commit_summary(NewSummary(namespace, cid, "a", 1, None, incarnation=3))
        await store.commit_summary(NewSummary(namespace, cid, "b", 2, None, incarnation=3))
        await store.enqueue(replace(new_job(namespace, cid), incarnation=3))
        first = await store.erase_conversation(namespace, cid, 3)
        assert (first.rows, first.summaries, first.jobs) == (3, 2, 1)
        again = await store.erase_conversation(namespace, cid, 3)
        assert (again.rows, again.summaries, again.jobs) == (0, 2, 1)
        # Without an incarnation (no tombstone): this call's only.
        other = uuid.uuid4()
        await store.commit_summary(NewSummary(namespace, other, "c", 1, None))
        bare = await store.erase_conversation(namespace, other, 0)
        assert (bare.rows, bare.summaries, bare.jobs) == (1, 1, 0)
        assert (await store.erase_conversation(namespace, other, 0)).summaries == 0

    async def test_purge_erases_summaries_history_and_jobs(
        self, store: SummaryStore, namespace: str
    ) -> None:
        cid = uuid.uuid4()
        await store.commit_summary(NewSummary(namespace, cid, "a", 1, None))
        await store.commit_summary(NewSummary(namespace, cid, "b", 2, None))
        await store.enqueue(new_job(namespace, cid))
        await store.erase_conversation(namespace, cid, 0)
        assert await store.get_summary(namespace, cid) is None
        assert await store.summary_history(namespace, cid) == []
        assert (await store.backlog(namespace)).depth == 0
