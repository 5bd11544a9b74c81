"""Erasure receipts (recorded with a transcript's deletion, merged by later calls of the
same erasure, read by id or by conversation), run against every TranscriptStore:
test_receipts_domain.py on the in-memory store, test_receipts_store.py on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from services.common.errors import Code, DomainError
from services.transcript.receipts.model import ErasureProgress
from services.transcript.service import TranscriptService
from tests.transcript.support import ServiceCases, assistant, new_conversation, reason_of, user


async def _incarnation(
    service: TranscriptService, namespace: str, cid: str = ""
) -> tuple[str, int]:
    """A conversation (made with `cid` when given) and its incarnation."""
    conversation, _ = await service.create_conversation(namespace, cid, {})
    return str(conversation.conversation_id), conversation.incarnation


class ReceiptCases(ServiceCases):
    """Subclasses provide a `store` fixture."""

    async def test_a_deletion_records_its_receipt_in_its_transaction(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.append(namespace, cid, 0, [user(), assistant()], "r1")
        await service.append(namespace, cid, 1, [user()], "r2")
        incarnation = (await service.get_conversation(namespace, cid)).incarnation
        progress = ErasureProgress({"summaries": 2, "memories": 1}, ["memory_index"])
        erased = await service.delete_conversation(namespace, cid, incarnation, progress)
        assert (erased.deleted, erased.entries, erased.appends) == (True, 3, 2)
        receipt = erased.receipt
        assert receipt is not None
        assert (receipt.namespace, str(receipt.conversation_id), receipt.incarnation) == (
            namespace,
            cid,
            incarnation,
        )
        assert receipt.counts == {
            "entries": 3,
            "appends": 2,
            "forks": 0,
            "checkpoints": 0,
            "summaries": 2,
            "memories": 1,
        }
        assert list(receipt.remaining) == ["memory_index"] and receipt.complete_time is None
        assert await service.get_receipt(namespace, str(receipt.receipt_id)) == receipt
        assert await service.get_receipt(namespace, "", cid) == receipt

    async def test_later_calls_merge_into_one_receipt(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await service.append(namespace, cid, 0, [user()], "r1")
        incarnation = (await service.get_conversation(namespace, cid)).incarnation
        # A first, partial call: memory was unavailable, the transcript kept.
        first = await service.record_receipt(
            namespace, cid, incarnation, {"summaries": 3}, ["memory", "memory_index", "transcript"]
        )
        assert first.complete_time is None
        # The retry finishes: counts only grow (the summaries were erased by the first call).
        done = await service.delete_conversation(
            namespace,
            cid,
            incarnation,
            ErasureProgress({"summaries": 0, "memories": 2}, ["memory_index"]),
        )
        assert done.receipt is not None and done.receipt.receipt_id == first.receipt_id
        assert done.receipt.counts == {
            "summaries": 3,
            "memories": 2,
            "entries": 1,
            "appends": 1,
            "forks": 0,
            "checkpoints": 0,
        }
        assert list(done.receipt.remaining) == ["memory_index"]
        # A stale report (the first call's, late) cannot bring a part back.
        late = await service.record_receipt(
            namespace, cid, incarnation, {"summaries": 3}, ["memory", "memory_index", "transcript"]
        )
        assert list(late.remaining) == ["memory_index"] and late.counts["memories"] == 2
        # The index caught up: complete, and for good.
        complete = await service.record_receipt(namespace, cid, incarnation, {}, [])
        assert complete.complete_time is not None and list(complete.remaining) == []
        again = await service.record_receipt(namespace, cid, incarnation, {}, ["memory"])
        assert again.complete_time == complete.complete_time and list(again.remaining) == []
        # A deletion retried after the transcript is gone merges too (nothing more deleted).
        retried = await service.delete_conversation(
            namespace, cid, incarnation, ErasureProgress({"memories": 2}, [])
        )
        assert not retried.deleted and retried.receipt is not None
        assert retried.receipt.receipt_id == first.receipt_id
        assert retried.receipt.counts["entries"] == 1  # kept: the larger count

    async def test_racing_reports_make_one_receipt(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid, incarnation = await _incarnation(service, namespace)
        made = await asyncio.gather(
            *(
                service.record_receipt(namespace, cid, incarnation, {"memories": i}, [])
                for i in range(8)
            )
        )
        assert len({r.receipt_id for r in made}) == 1
        assert (await service.get_receipt(namespace, "", cid)).counts == {"memories": 7}

    async def test_a_receipt_is_not_found_under_another_namespace(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid, incarnation = await _incarnation(service, namespace)
        receipt = await service.record_receipt(namespace, cid, incarnation, {"entries": 1}, [])
        for ns, rid, conversation in (
            (namespace + "-b", str(receipt.receipt_id), ""),
            (namespace + "-b", "", cid),
            (namespace, str(uuid.uuid4()), ""),
            (namespace, "", str(uuid.uuid4())),
        ):
            with pytest.raises(DomainError) as caught:
                await service.get_receipt(ns, rid, conversation)
            assert caught.value.code is Code.NOT_FOUND
            assert reason_of(caught) == "ERASURE_RECEIPT_NOT_FOUND"

    async def test_the_latest_receipt_of_an_id_made_again(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid, first = await _incarnation(service, namespace)
        older = await service.record_receipt(namespace, cid, first, {"entries": 1}, [])
        await service.delete_conversation(namespace, cid, first)
        _, second = await _incarnation(service, namespace, cid)
        assert second != first
        newer = await service.record_receipt(namespace, cid, second, {"entries": 2}, [])
        assert older.receipt_id != newer.receipt_id
        assert (await service.get_receipt(namespace, "", cid)).receipt_id == newer.receipt_id
        assert (await service.get_receipt(namespace, str(older.receipt_id))).counts == {
            "entries": 1
        }

    async def test_bad_reports_and_lookups_are_refused(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = str(uuid.uuid4())
        cases = [
            (service.record_receipt(namespace, cid, 0, {}, []), "INVALID_INCARNATION"),
            (
                service.record_receipt(namespace, cid, 1, {"Entries": 1}, []),
                "INVALID_ERASURE_PROGRESS",
            ),
            (
                service.record_receipt(namespace, cid, 1, {"entries": -1}, []),
                "INVALID_ERASURE_PROGRESS",
            ),
            (service.record_receipt(namespace, cid, 1, {}, ["x" * 33]), "INVALID_ERASURE_PROGRESS"),
            (
                service.record_receipt(
                    namespace, cid, 1, {f"c_{'a' * i}": 1 for i in range(33)}, []
                ),
                "INVALID_ERASURE_PROGRESS",
            ),
            (service.record_receipt(namespace, "nope", 1, {}, []), "INVALID_CONVERSATION_ID"),
            (service.get_receipt(namespace, "", ""), "INVALID_RECEIPT_ID"),
            (service.get_receipt(namespace, "nope", ""), "INVALID_RECEIPT_ID"),
            (service.get_receipt(namespace, str(uuid.uuid4()), cid), "INVALID_RECEIPT_ID"),
            (
                service.delete_conversation(namespace, cid, 0, ErasureProgress({}, [])),
                "INVALID_INCARNATION",
            ),
        ]
        for call, expected in cases:
            with pytest.raises(DomainError) as caught:
                await call
            assert (caught.value.code, reason_of(caught)) == (Code.INVALID_ARGUMENT, expected)

    async def test_receipts_past_their_retention_are_swept(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid, incarnation = await _incarnation(service, namespace)
        await service.record_receipt(namespace, cid, incarnation, {"entries": 1}, [])
        sweep = service.store.sweep_receipts
        assert await sweep(3600.0, 100) == 0
        assert await sweep(0.0, 100) >= 1
        with pytest.raises(DomainError):
            await service.get_receipt(namespace, "", cid)

    async def test_no_receipt_is_made_for_a_conversation_that_was_not_there(
        self, service: TranscriptService, namespace: str
    ) -> None:
        # Receipts are exempt from admission (erasure is never refused for load): a caller
        # must not fill the table with receipts of conversations it never had.
        cid, incarnation = await _incarnation(service, namespace)
        for ns, conversation, inc in (
            (namespace, str(uuid.uuid4()), 1),  # never made
            (namespace, cid, incarnation + 1),  # not that incarnation
            (f"{namespace}-b", cid, incarnation),  # another namespace's
        ):
            with pytest.raises(DomainError) as caught:
                await service.record_receipt(ns, conversation, inc, {"entries": 1}, [])
            assert (caught.value.code, reason_of(caught)) == (
                Code.NOT_FOUND,
                "CONVERSATION_NOT_FOUND",
            )
            erased = await service.delete_conversation(
                ns, conversation, inc, ErasureProgress({"entries": 1}, [])
            )
            assert not erased.deleted and erased.receipt is None
            with pytest.raises(DomainError):
                await service.get_receipt(ns, "", conversation)
        # Once made, it is merged into after the conversation is gone (a retry).
        made = await service.record_receipt(namespace, cid, incarnation, {}, ["transcript"])
        await service.delete_conversation(namespace, cid, incarnation)
        merged = await service.record_receipt(namespace, cid, incarnation, {"memories": 1}, [])
        assert merged.receipt_id == made.receipt_id and merged.complete_time is not None
