"""Erasure receipts (TranscriptService): record one, merge into it, read it. Validates
requests; knows nothing of gRPC or SQL (the store is a `ReceiptStore`)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

import uuid_utils

from services.common import validation
from services.common.errors import invalid_argument
from services.common.validation import conversation_id
from services.transcript.conversations.model import conversation_not_found
from services.transcript.receipts.model import ErasureReceipt, check_progress, receipt_not_found
from services.transcript.receipts.store import ReceiptStore


def incarnation_to_erase(incarnation: int) -> int:
    """The incarnation a receipt names: a real one (a receipt of "whatever exists" would
    not say what was erased)."""
    if incarnation < 1:
        raise invalid_argument(
            "INVALID_INCARNATION",
            "an erasure receipt names the incarnation erased (at least 1)",
            field="incarnation",
        )
    return incarnation


class Receipts:
    """The receipt methods of TranscriptService (services/transcript/service.py)."""

    store: ReceiptStore

    async def record_receipt(
        self,
        namespace: str,
        conversation_id_text: str,
        incarnation: int,
        counts: Mapping[str, int],
        remaining: Sequence[str],
    ) -> ErasureReceipt:
        """Make the receipt of an erasure of one incarnation of a conversation, or merge
        what a later call of the same erasure reports into it: counts only grow, parts
        only leave `remaining`, and it is complete once nothing remains.

        A receipt is made only for an incarnation that exists (an erasure records one before
        it deletes the transcript), and merged into once made, whether the conversation is
        still there or not (the receipt outlives it). Otherwise CONVERSATION_NOT_FOUND: a
        caller cannot fill the table with receipts of conversations it never had."""
        validation.namespace(namespace)
        cid = conversation_id(conversation_id_text)
        progress = check_progress(counts, remaining)
        kept = await self.store.record_receipt(
            namespace,
            cid,
            incarnation_to_erase(incarnation),
            progress,
            uuid.UUID(str(uuid_utils.uuid7())),
        )
        if kept is None:
            raise conversation_not_found()
        return kept

    async def get_receipt(
        self, namespace: str, receipt_id_text: str, conversation_id_text: str = ""
    ) -> ErasureReceipt:
        """A receipt by id, or (no id) the latest of a conversation id;
        ERASURE_RECEIPT_NOT_FOUND when there is none in this namespace."""
        validation.namespace(namespace)
        if receipt_id_text:
            if conversation_id_text:
                raise invalid_argument(
                    "INVALID_RECEIPT_ID",
                    "give receipt_id or conversation_id, not both",
                    field="conversation_id",
                )
            rid = validation.uuid_id(receipt_id_text, "receipt_id", "INVALID_RECEIPT_ID")
            found = await self.store.get_receipt(namespace, rid)
        elif conversation_id_text:
            found = await self.store.latest_receipt(
                namespace, conversation_id(conversation_id_text)
            )
        else:
            raise invalid_argument(
                "INVALID_RECEIPT_ID",
                "give the receipt_id (or the conversation_id of the erased conversation)",
                field="receipt_id",
            )
        if found is None:
            raise receipt_not_found()
        return found
