"""Erasure receipts in the orchestrator's saga, with the real transcript domain (and its
receipts) behind in-memory ports: one receipt per incarnation whatever fails and is
retried, counts that add up across calls, and a receipt completed when the index has
caught up."""

from __future__ import annotations

import pytest

from services.agent.model import Recalled
from services.common.domain import Budget
from services.common.errors import Code, DomainError
from tests.agent.test_agent_domain import NS, World


async def erased_world(entries: int = 40) -> tuple[World, str]:
    world = World(memories=[Recalled("m-1", "a fact", 0.9), Recalled("m-2", "b", 0.8)])
    cid = await world.conversation(entries)
    await world.summaries.summarize(NS, cid, 16, 64, 1, Budget(10, 10, 10))
    await world.summaries.request(NS, cid, 16, 64)
    return world, cid


async def test_a_retried_partial_erasure_completes_one_receipt() -> None:
    world, cid = await erased_world()
    incarnation = await world.transcripts.incarnation(NS, cid)
    world.memories.down = True
    first = await world.agent.erase(NS, cid)
    assert list(first.remaining) == ["memory", "transcript"]
    # Recorded meanwhile: what the first call erased, and every part it could not.
    partial = first.receipt
    assert partial is not None and partial.incarnation == incarnation
    assert dict(partial.counts) == {
        "summaries": 1,
        "summary_jobs": 1,
        "curation_jobs": 0,
        "forks": 0,
    }
    assert list(partial.remaining) == ["memory", "memory_index", "transcript"]
    assert partial.complete_time is None
    world.memories.down = False
    again = await world.agent.erase(NS, cid)
    assert again.complete and again.receipt is not None
    done = again.receipt
    # The same receipt, with the first call's counts kept (this call erased no summary).
    assert done.receipt_id == partial.receipt_id
    assert dict(done.counts) == {
        "entries": 40,
        "appends": 1,
        "summaries": 1,
        "summary_jobs": 1,
        "curation_jobs": 0,
        "forks": 0,
        "checkpoints": 0,
        "memories": 2,
        "memory_revisions": 2,
        "index_points": 2,
    }
    assert list(done.remaining) == [] and done.complete_time is not None
    # Erasing again: nothing more, the same receipt.
    third = await world.agent.erase(NS, cid)
    assert third.complete and third.receipt == done
    assert await world.agent.receipt(NS, done.receipt_id) == done


async def test_an_unreachable_transcript_leaves_no_receipt_until_the_retry() -> None:
    world, cid = await erased_world()
    world.transcripts.down = True
    first = await world.agent.erase(NS, cid)
    assert list(first.remaining) == ["transcript"] and first.receipt is None
    world.transcripts.down = False
    again = await world.agent.erase(NS, cid)
    assert again.complete and again.receipt is not None
    # The summaries were erased by the first call: their tombstone kept the count.
    assert again.receipt.counts["summaries"] == 1 and again.receipt.counts["memories"] == 2
    assert again.summaries_deleted == 0 and again.entries_deleted == 40


async def test_the_receipt_is_completed_once_the_index_caught_up() -> None:
    world, cid = await erased_world()
    world.memories.index_caught_up = False
    erased = await world.agent.erase(NS, cid)
    assert erased.complete and erased.receipt is not None
    receipt = erased.receipt
    assert list(receipt.remaining) == ["memory_index"] and receipt.complete_time is None
    assert (await world.agent.receipt(NS, receipt.receipt_id)).complete_time is None
    world.memories.down = True  # MemoryService unreachable: the receipt as kept
    assert (await world.agent.receipt(NS, "", cid)).remaining == ["memory_index"]
    world.memories.down = False
    world.memories.index_caught_up = True
    completed = await world.agent.receipt(NS, "", cid)
    assert completed.receipt_id == receipt.receipt_id
    assert list(completed.remaining) == [] and completed.complete_time is not None
    assert (await world.agent.receipt(NS, receipt.receipt_id)) == completed


async def test_a_retry_after_the_transcript_is_gone_finishes_its_erasure() -> None:
    # The erasure's reply was lost after the deletion, the index still behind: the retry
    # finds no conversation, and finishes the erasure its receipt says is unfinished.
    world, cid = await erased_world()
    world.memories.index_caught_up = False
    first = await world.agent.erase(NS, cid)
    assert first.receipt is not None and first.receipt.complete_time is None
    world.memories.index_caught_up = True
    again = await world.agent.erase(NS, cid)
    assert again.complete and again.receipt is not None
    assert again.receipt.receipt_id == first.receipt.receipt_id
    assert again.receipt.complete_time is not None
    assert again.receipt.counts["entries"] == 40


async def test_a_conversation_never_erased_has_no_receipt() -> None:
    world = World()
    erased = await world.agent.erase(NS, "0190f0f0-0000-7000-8000-000000000001")
    assert erased.complete and erased.receipt is None
    with pytest.raises(DomainError) as missing:
        await world.agent.receipt(NS, "", "0190f0f0-0000-7000-8000-000000000001")
    assert (missing.value.code, missing.value.reason) == (
        Code.NOT_FOUND,
        "ERASURE_RECEIPT_NOT_FOUND",
    )


async def test_a_receipt_is_not_found_under_another_namespace() -> None:
    world, cid = await erased_world()
    erased = await world.agent.erase(NS, cid)
    assert erased.receipt is not None
    for call in (
        world.agent.receipt("tenant-b", erased.receipt.receipt_id),
        world.agent.receipt("tenant-b", "", cid),
    ):
        with pytest.raises(DomainError) as missing:
            await call
        assert missing.value.reason == "ERASURE_RECEIPT_NOT_FOUND"


async def test_a_forks_summary_is_erased_before_the_transcript_and_a_retry_finishes() -> None:
    # The fork's summary goes first (for the fork's incarnation); MemoryService down keeps
    # the transcript, so the retry still finds the fork and erases what is left of it.
    world, cid = await erased_world()
    fork, _ = await world.transcripts.service.fork_conversation(NS, cid, 20)
    fork_id = str(fork.conversation_id)
    await world.summaries.summarize(NS, fork_id, 16, 64, 1, Budget(10, 10, 10))
    assert fork_id in world.summaries.summaries
    world.memories.down = True
    first = await world.agent.erase(NS, cid)
    assert list(first.remaining) == ["memory", "transcript"]
    assert fork_id not in world.summaries.summaries
    assert (fork_id, fork.incarnation) in world.summaries.erased
    assert first.receipt is not None and first.receipt.counts["summaries"] == 2
    assert [
        str(f.conversation_id) for f in (await world.transcripts.service.list_forks(NS, cid)).forks
    ] == [fork_id]
    world.memories.down = False
    again = await world.agent.erase(NS, cid)
    assert again.complete and again.receipt is not None
    assert again.receipt.receipt_id == first.receipt.receipt_id
    # The fork's memories were erased for its own incarnation, and it went with the source.
    assert (fork_id, fork.incarnation) in world.memories.erased
    assert again.receipt.counts["summaries"] == 2 and again.receipt.counts["forks"] == 1
    assert await world.transcripts.incarnation(NS, fork_id) is None


async def test_a_fork_made_between_the_listing_and_the_deletion_has_its_summary_erased() -> None:
    """The instant between the saga's listing of the forks and the transcript's deletion:
    a fork made (and summarized) there is found by the deletion, which refuses
    (FORKS_CHANGED) and deletes nothing; the saga lists the forks again, erases the new
    fork's summary for its incarnation, and then deletes. Nothing of it survives."""
    world, cid = await erased_world()
    first, _ = await world.transcripts.service.fork_conversation(NS, cid, 10)
    listing = world.transcripts.forks
    late: list[tuple[str, int]] = []

    async def forks_then_a_new_one(namespace: str, conversation_id: str) -> list[tuple[str, int]]:
        found = await listing(namespace, conversation_id)
        if not late:  # the first listing: a fork is made right after it
            fork, _ = await world.transcripts.service.fork_conversation(NS, cid, 20)
            late.append((str(fork.conversation_id), fork.incarnation))
            await world.summaries.summarize(NS, late[0][0], 16, 64, 1, Budget(10, 10, 10))
        return found

    world.transcripts.forks = forks_then_a_new_one  # type: ignore[method-assign]
    erased = await world.agent.erase(NS, cid)
    assert erased.complete and erased.receipt is not None
    assert late and late[0][0] not in world.summaries.summaries
    assert late[0] in world.summaries.erased and late[0] in world.memories.erased
    assert (str(first.conversation_id), first.incarnation) in world.summaries.erased
    # Each fork's parts counted once: the source's summary and the late fork's.
    assert erased.receipt.counts["summaries"] == 2 and erased.receipt.counts["forks"] == 2
    for gone in (cid, str(first.conversation_id), late[0][0]):
        assert await world.transcripts.incarnation(NS, gone) is None


async def test_forks_made_faster_than_the_rounds_leave_the_transcript_to_the_retry() -> None:
    """A fork made after every listing of one call: the transcript is kept (remaining),
    nothing of a fork is left underived, and the retry finishes."""
    world, cid = await erased_world()
    listing = world.transcripts.forks
    made = 0

    async def always_a_new_one(namespace: str, conversation_id: str) -> list[tuple[str, int]]:
        nonlocal made
        found = await listing(namespace, conversation_id)
        if made < 4:
            await world.transcripts.service.fork_conversation(NS, cid, 5 + made)
            made += 1
        return found

    world.transcripts.forks = always_a_new_one  # type: ignore[method-assign]
    first = await world.agent.erase(NS, cid)
    assert list(first.remaining) == ["transcript"]
    assert await world.transcripts.incarnation(NS, cid) is not None
    again = await world.agent.erase(NS, cid)
    assert again.complete and again.receipt is not None
    assert again.receipt.counts["forks"] == 4
