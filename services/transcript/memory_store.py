"""An in-memory TranscriptStore: for domain unit tests and single-process use.

It obeys the same protocol and atomicity as the PostgreSQL store (one lock
around every write), so the domain tests exercise the real rules.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from services.common.domain import Entry
from services.common.errors import VersionConflict
from services.transcript.model import (
    AppendRecord,
    AppendResult,
    Conversation,
    NewAppend,
    ViewRead,
)
from services.transcript.store import conversation_not_found, request_id_reused


@dataclass
class _Stored:
    conversation: Conversation
    entries: list[Entry] = field(default_factory=list)
    appends: dict[str, AppendRecord] = field(default_factory=dict)


class InMemoryTranscriptStore:
    """TranscriptStore held in a dict."""

    def __init__(self) -> None:
        self._data: dict[tuple[str, uuid.UUID], _Stored] = {}
        self._lock = asyncio.Lock()

    async def create_conversation(
        self, namespace: str, conversation_id: uuid.UUID, labels: Mapping[str, str]
    ) -> tuple[Conversation, bool]:
        async with self._lock:
            key = (namespace, conversation_id)
            if key in self._data:
                return self._data[key].conversation, False
            now = datetime.now(UTC)
            conversation = Conversation(conversation_id, namespace, 0, 0, now, now, dict(labels))
            self._data[key] = _Stored(conversation)
            return conversation, True

    async def get_conversation(
        self, namespace: str, conversation_id: uuid.UUID
    ) -> Conversation | None:
        stored = self._data.get((namespace, conversation_id))
        return stored.conversation if stored else None

    async def append(self, append: NewAppend) -> AppendResult:
        async with self._lock:
            stored = self._data.get((append.namespace, append.conversation_id))
            if stored is None:
                raise conversation_not_found()
            if append.request_id is not None and append.request_id in stored.appends:
                record = stored.appends[append.request_id]
                if record.payload_hash != append.payload_hash:
                    raise request_id_reused()
                return AppendResult(record, replayed=True)
            current = stored.conversation
            if append.expected_version is not None and current.version != append.expected_version:
                raise VersionConflict(current.version, append.expected_version)
            now = datetime.now(UTC)
            first = current.last_sequence + 1
            for offset, message in enumerate(append.messages):
                stored.entries.append(Entry(first + offset, message, now))
            last = current.last_sequence + len(append.messages)
            stored.conversation = replace(
                current, version=current.version + 1, last_sequence=last, update_time=now
            )
            record = AppendRecord(
                current.version + 1, first, last, append.usage, now, append.payload_hash
            )
            if append.request_id is not None:
                stored.appends[append.request_id] = record
            return AppendResult(record, replayed=False)

    async def read_entries(
        self, namespace: str, conversation_id: uuid.UUID, ranges: Sequence[tuple[int, int]]
    ) -> list[Entry]:
        stored = self._data.get((namespace, conversation_id))
        if stored is None:
            return []
        return [
            stored.entries[s - 1]
            for low, high in ranges
            for s in range(low, min(high, len(stored.entries)) + 1)
        ]

    async def read_view(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        window: int,
        summary_batch: int,
        summarized_through: int,
        request_id: str | None,
    ) -> ViewRead | None:
        stored = self._data.get((namespace, conversation_id))
        if stored is None:
            return None
        last = stored.conversation.last_sequence
        low = max(1, last - window + 1)
        ranges = [
            (summarized_through + 1, min(summarized_through + summary_batch + 1, low - 1)),
            (low, last),
        ]
        entries = await self.read_entries(namespace, conversation_id, ranges)
        prior = stored.appends.get(request_id) if request_id is not None else None
        return ViewRead(stored.conversation.version, last, entries, prior)

    async def list_entries(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        after_sequence: int,
        through_sequence: int | None,
        limit: int,
    ) -> list[Entry] | None:
        stored = self._data.get((namespace, conversation_id))
        if stored is None:
            return None
        high = len(stored.entries) if through_sequence is None else through_sequence
        return stored.entries[after_sequence:high][:limit]

    async def list_conversations(
        self, namespace: str, after: uuid.UUID | None, limit: int
    ) -> list[Conversation]:
        ids = sorted(
            cid for ns, cid in self._data if ns == namespace and (after is None or cid > after)
        )
        return [self._data[(namespace, cid)].conversation for cid in ids[:limit]]

    async def delete_conversation(self, namespace: str, conversation_id: uuid.UUID) -> int | None:
        async with self._lock:
            stored = self._data.pop((namespace, conversation_id), None)
            return None if stored is None else len(stored.entries)
