"""An erasure's receipt, checked against the stores through a real all-in-one server: the
rows and index points of the conversation before, the counts in the receipt, and none of
them after (entries, appends, summaries and their history, summary jobs, memories, the
content of their revisions, index points), with Qdrant Edge and with pgvector. The
receipt is kept after the erasure, readable by GetErasureReceipt in its namespace only,
completed once the index has caught up, and holds no content.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import pytest

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.common.postgres.pool import Database
from services.common.status import error_info
from services.memory.component import MemoryComponent
from services.memory.index.protocol import VectorIndex
from tests.support.stack import Stack, full_stack
from tests.support.waiting import wait_for

# What the conversation says, and what was derived from it: none of it may be in a receipt.
TEXTS = [f"the vault code is amber-{i}-falcon" for i in range(6)]
SUMMARIES = ["summary: the vault code was said twice", "summary: the vault code, six times"]
FACTS = ["The vault code is amber falcon.", "The vault code is amber falcon, said again."]
MIXED = "The vault is in the cellar (from the chat and a document)."
DOCUMENT = "urn:runifold-test:document:vault"


def _index(stack: Stack) -> VectorIndex:
    component = next(c for c in stack.running.components if isinstance(c, MemoryComponent))
    assert component.index is not None
    return component.index


async def _rows(db: Database, sql: str, *params: object) -> int:
    async with db.connection() as conn:
        cursor = await conn.execute(sql.encode(), params)
        row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def _store_counts(
    db: Database, namespace: str, cid: str, memory_ids: list[str]
) -> dict[str, int]:
    """What the stores hold of the conversation, as the receipt names it."""
    conversation = uuid.UUID(cid)
    key = (
        "SELECT conversation_key FROM transcript.conversations "
        "WHERE namespace = %s AND conversation_id = %s"
    )
    mids = [uuid.UUID(m) for m in memory_ids]
    return {
        "entries": await _rows(
            db,
            f"SELECT count(*) FROM transcript.entries WHERE conversation_key = ({key})",
            namespace,
            conversation,
        ),
        "appends": await _rows(
            db,
            f"SELECT count(*) FROM transcript.appends WHERE conversation_key = ({key})",
            namespace,
            conversation,
        ),
        "summaries": await _rows(
            db,
            "SELECT (SELECT count(*) FROM summary.summaries WHERE namespace = %s"
            " AND conversation_id = %s) + (SELECT count(*) FROM summary.summary_history"
            " WHERE namespace = %s AND conversation_id = %s)",
            namespace,
            conversation,
            namespace,
            conversation,
        ),
        "summary_jobs": await _rows(
            db,
            "SELECT count(*) FROM summary.jobs WHERE namespace = %s AND conversation_id = %s",
            namespace,
            conversation,
        ),
        "memories": await _rows(
            db,
            "SELECT count(*) FROM memory.memories WHERE namespace = %s AND memory_id = ANY(%s)",
            namespace,
            mids,
        ),
        "memory_revisions": await _rows(
            db,
            "SELECT count(*) FROM memory.revisions WHERE namespace = %s AND memory_id = ANY(%s)"
            " AND content IS NOT NULL",
            namespace,
            mids,
        ),
    }


@pytest.mark.parametrize("index", ["edge", "pgvector"])
async def test_the_receipt_counts_what_the_stores_held_and_they_hold_none_of_it_after(
    shared_database_url: str, database: Database, namespace: str, tmp_path: Path, index: str
) -> None:
    async with full_stack(
        shared_database_url,
        tmp_path,
        None,
        memory={"index": index},
        # No worker: the summary job stays queued until the erasure (a count to check).
        summary_env={"RUNIFOLD_SUMMARY_WORKERS": "0"},
    ) as stack:
        cid = (
            await stack.transcript.CreateConversation(
                transcript_pb.CreateConversationRequest(namespace=namespace)
            )
        ).conversation.conversation_id
        other = (
            await stack.transcript.CreateConversation(
                transcript_pb.CreateConversationRequest(namespace=namespace)
            )
        ).conversation.conversation_id
        for target in (cid, other):
            for i in range(3):  # three appends of two messages
                await stack.transcript.AppendEntries(
                    transcript_pb.AppendEntriesRequest(
                        namespace=namespace,
                        conversation_id=target,
                        messages=[
                            common_pb2.Message(role=common_pb2.ROLE_USER, text=text)
                            for text in TEXTS[2 * i : 2 * i + 2]
                        ],
                    )
                )
        for through, text in ((2, SUMMARIES[0]), (4, SUMMARIES[1])):
            await stack.summary.CommitSummary(
                summary_pb.CommitSummaryRequest(
                    namespace=namespace, conversation_id=cid, text=text, through_sequence=through
                )
            )
        await stack.summary.RequestSummary(
            summary_pb.RequestSummaryRequest(
                namespace=namespace, conversation_id=cid, window=2, summary_batch=2
            )
        )

        def source(conversation: str, low: int, high: int) -> memory_pb.MemorySource:
            return memory_pb.MemorySource(
                conversation_id=conversation, from_sequence=low, through_sequence=high
            )

        first = await stack.memory.UpsertMemory(
            memory_pb.UpsertMemoryRequest(
                namespace=namespace, content=FACTS[0], sources=[source(cid, 1, 2)]
            )
        )
        await stack.memory.UpsertMemory(
            memory_pb.UpsertMemoryRequest(
                namespace=namespace,
                memory_id=first.memory.memory_id,
                content=FACTS[1],
                sources=[source(cid, 1, 4)],
                expected_revision=1,
            )
        )
        mixed = await stack.memory.UpsertMemory(
            memory_pb.UpsertMemoryRequest(
                namespace=namespace,
                content=MIXED,
                sources=[source(cid, 5, 6), memory_pb.MemorySource(external_uri=DOCUMENT)],
            )
        )
        kept = await stack.memory.UpsertMemory(
            memory_pb.UpsertMemoryRequest(
                namespace=namespace, content=FACTS[0], sources=[source(other, 1, 2)]
            )
        )
        derived = [first.memory.memory_id, mixed.memory.memory_id]
        keys = {(namespace, uuid.UUID(m)) for m in derived}
        kept_key = (namespace, uuid.UUID(kept.memory.memory_id))
        points = _index(stack)

        async def indexed() -> bool:
            return {*keys, kept_key} <= await points.keys()

        await wait_for(indexed, timeout=60)
        before = await _store_counts(database, namespace, cid, derived)
        before["index_points"] = len(keys & await points.keys())
        assert before == {
            "entries": 6,
            "appends": 3,
            "summaries": 2,
            "summary_jobs": 1,
            "memories": 2,
            "memory_revisions": 3,
            "index_points": 2,
        }

        erased = await stack.agent.EraseConversation(
            agent_pb.EraseConversationRequest(namespace=namespace, conversation_id=cid)
        )
        assert erased.complete and erased.HasField("receipt")
        receipt = erased.receipt
        counts = {name: getattr(receipt, name) for name in before}
        assert counts == before
        assert (receipt.curation_jobs, receipt.forks) == (0, 0)
        assert receipt.conversation_id == cid and receipt.namespace == namespace

        # Kept after the erasure; completed once the index caught up.
        async def complete() -> bool:
            got = await stack.agent.GetErasureReceipt(
                agent_pb.GetErasureReceiptRequest(
                    namespace=namespace, receipt_id=receipt.receipt_id
                )
            )
            return got.receipt.HasField("complete_time")

        await wait_for(complete, timeout=60)
        final = (
            await stack.agent.GetErasureReceipt(
                agent_pb.GetErasureReceiptRequest(namespace=namespace, conversation_id=cid)
            )
        ).receipt
        assert final.receipt_id == receipt.receipt_id and list(final.remaining) == []
        assert {name: getattr(final, name) for name in before} == before

        # The stores hold nothing of that incarnation; the revisions keep no content.
        after = await _store_counts(database, namespace, cid, derived)
        assert after == dict.fromkeys(after, 0)
        assert not keys & await points.keys()
        assert kept_key in await points.keys()
        assert (
            await stack.memory.GetMemory(
                memory_pb.GetMemoryRequest(namespace=namespace, memory_id=kept.memory.memory_id)
            )
        ).memory.content == FACTS[0]

        # No content in the receipt, on the wire or as the console's JSON would show it.
        for message in (erased, final):
            wire = message.SerializeToString()
            for text in [*TEXTS, *SUMMARIES, *FACTS, MIXED, DOCUMENT]:
                assert text.encode() not in wire
                assert b"vault" not in wire

        # In its namespace only: another namespace is told nothing.
        for request in (
            agent_pb.GetErasureReceiptRequest(
                namespace=f"{namespace}-b", receipt_id=receipt.receipt_id
            ),
            agent_pb.GetErasureReceiptRequest(namespace=f"{namespace}-b", conversation_id=cid),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stack.agent.GetErasureReceipt(request)
            assert caught.value.code() == grpc.StatusCode.NOT_FOUND
            assert error_info(caught.value).reason == "ERASURE_RECEIPT_NOT_FOUND"  # type: ignore[union-attr]

        # Erasing again: nothing more, and still one receipt.
        again = await stack.agent.EraseConversation(
            agent_pb.EraseConversationRequest(namespace=namespace, conversation_id=cid)
        )
        assert again.complete and again.receipt.receipt_id == receipt.receipt_id
        assert (
            await _rows(
                database,
                "SELECT count(*) FROM transcript.erasure_receipts"
                " WHERE namespace = %s AND conversation_id = %s",
                namespace,
                uuid.UUID(cid),
            )
            == 1
        )
