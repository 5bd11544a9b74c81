"""An in-memory MemoryStore: for domain unit tests.

It obeys the same protocol and atomicity as the PostgreSQL store (one lock
around every write, outbox rows written with the change), so the domain
tests exercise the real rules. Full-text search is a plain word overlap.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from services.memory.model import (
    ExternalSource,
    Forgotten,
    Key,
    Memory,
    MemoryErasure,
    MemorySource,
    RevisionRecord,
    invalid_validity,
    memory_not_found,
)
from services.memory.outbox.model import OutboxClaim, OutboxDepth, OutboxEntry
from services.memory.search.model import ScoredMemory
from services.memory.writes.model import (
    MemoryWrite,
    WriteResult,
    memory_exists,
    request_id_reused,
    revision_conflict,
    source_not_found,
    superseded_conflict,
    superseded_not_found,
    supersedes_later_fact,
    supersession_cycle,
    validity_ended,
)

_WORD = re.compile(r"\w+")


class InMemoryMemoryStore:
    """MemoryStore held in dicts."""

    def __init__(self, now: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.now = now
        self._memories: dict[Key, Memory] = {}
        self._history: dict[Key, list[RevisionRecord]] = {}
        self._outbox: list[tuple[OutboxEntry, datetime]] = []
        # seq -> (claim token, claim expiry) of the claimed outbox rows.
        self._claims: dict[int, tuple[uuid.UUID, datetime]] = {}
        self._seq = itertools.count(1)
        self._erased: set[tuple[str, uuid.UUID, int]] = set()
        # The counts of each tombstone's erasures: memories, revisions, the outbox
        # position at or above their index writes, when the index caught up.
        self._erasures: dict[tuple[str, uuid.UUID, int], MemoryErasure] = {}
        self._outbox_through: dict[tuple[str, uuid.UUID, int], int] = {}
        # Revisions whose content the last _erase blanked.
        self._blanked = 0
        # (namespace, request id) -> (payload hash, memory id, revision, created, recorded)
        self._requests: dict[tuple[str, str], tuple[bytes, uuid.UUID, int, bool, datetime]] = {}
        self._lock = asyncio.Lock()

    def _live(self, memory: Memory) -> bool:
        return memory.expire_time is None or memory.expire_time > self.now()

    def _enqueue(self, key: Key) -> None:
        self._outbox.append((OutboxEntry(next(self._seq), key[0], key[1]), self.now()))

    def _valid(self, memory: Memory, valid_at: datetime | None) -> bool:
        return valid_at is None or memory.valid_at(valid_at)

    def _record(self, memory: Memory, reason: str) -> None:
        self._history.setdefault((memory.namespace, memory.memory_id), []).append(
            RevisionRecord(
                memory.revision,
                "write",
                reason,
                memory.update_time,
                memory.content,
                memory.metadata,
                tuple(memory.sources),
                memory.expire_time,
                memory.valid_from_time,
                memory.valid_until_time,
                memory.superseded_by,
            )
        )
        self._enqueue((memory.namespace, memory.memory_id))

    def _erase(self, key: Key, reason: str) -> bool:
        """The PostgreSQL ERASE: delete, blank the history, tombstone, and reopen what the
        erased memory superseded."""
        memory = self._memories.pop(key)
        history = self._history.setdefault(key, [])
        self._blanked = sum(1 for r in history if r.content is not None)
        history[:] = [
            replace(
                r,
                content=None,
                metadata={},
                sources=(),
                valid_from_time=None,
                valid_until_time=None,
                superseded_by=None,
            )
            for r in history
        ]
        history.append(RevisionRecord(memory.revision + 1, "delete", reason, self.now()))
        self._enqueue(key)
        for other_key, other in list(self._memories.items()):
            if other_key[0] == key[0] and other.superseded_by == memory.memory_id:
                reopened = replace(
                    other,
                    valid_until_time=None,
                    superseded_by=None,
                    revision=other.revision + 1,
                    update_time=self.now(),
                )
                self._memories[other_key] = reopened
                self._history[other_key] = [
                    replace(r, valid_until_time=None, superseded_by=None)
                    if r.superseded_by == memory.memory_id
                    else r
                    for r in self._history.get(other_key, [])
                ]
                self._record(reopened, "reopened")
        return self._live(memory)

    def _check_supersedes(self, write: MemoryWrite, memory: Memory) -> list[Key]:
        """The PostgreSQL store's checks of a supersession; the keys to supersede."""
        assert memory.valid_from_time is not None
        keys = []
        for i, wanted in enumerate(write.supersedes):
            key = (write.namespace, wanted.memory_id)
            other = self._memories.get(key)
            if other is None or not self._live(other) or wanted.memory_id == memory.memory_id:
                raise superseded_not_found(i)
            if wanted.expected_revision is not None and other.revision != wanted.expected_revision:
                raise superseded_conflict(i, other.revision, wanted.expected_revision)
            if other.valid_until_time is not None:
                raise validity_ended(i, other.superseded_by)
            assert other.valid_from_time is not None
            if other.valid_from_time >= memory.valid_from_time:
                raise supersedes_later_fact(i)
            keys.append(key)
        successor, seen = memory.superseded_by, set()
        ids = [k[1] for k in keys]
        while successor is not None and successor not in seen:
            if successor in ids:
                raise supersession_cycle(ids.index(successor))
            seen.add(successor)
            found = self._memories.get((write.namespace, successor))
            successor = found.superseded_by if found else None
        return keys

    def _write(self, write: MemoryWrite, memory: Memory, reason: str, created: bool) -> WriteResult:
        """Check the supersession, then store the memory and close what it supersedes."""
        keys = self._check_supersedes(write, memory)
        self._memories[(memory.namespace, memory.memory_id)] = memory
        self._record(memory, reason)
        superseded = []
        for key in keys:
            closed = replace(
                self._memories[key],
                valid_until_time=memory.valid_from_time,
                superseded_by=memory.memory_id,
                revision=self._memories[key].revision + 1,
                update_time=self.now(),
            )
            self._memories[key] = closed
            self._record(closed, "superseded")
            superseded.append(closed)
        return self._recorded(write, WriteResult(memory, created, superseded))

    def _fence(self, write: MemoryWrite) -> WriteResult | None:
        """The PostgreSQL store's `_fence`: refuse a fenced source, replay a request id."""
        for cid, incarnation in write.source_incarnations.items():
            if (write.namespace, cid, incarnation) in self._erased:
                raise source_not_found()
        if write.request_id is None:
            return None
        recorded = self._requests.get((write.namespace, write.request_id))
        if recorded is None:
            return None
        digest, memory_id, revision, created, _ = recorded
        if digest != write.payload_hash:
            raise request_id_reused()
        memory = self._memories.get((write.namespace, memory_id))
        if memory is not None and memory.revision == revision and self._live(memory):
            return WriteResult(memory, created)
        old = next(
            (
                r
                for r in self._history.get((write.namespace, memory_id), [])
                if r.revision == revision and r.content is not None
            ),
            None,
        )
        if old is None or old.content is None or memory is None:
            raise memory_not_found()
        return WriteResult(
            replace(
                memory,
                content=old.content,
                metadata=old.metadata,
                revision=revision,
                valid_from_time=old.valid_from_time,
                valid_until_time=old.valid_until_time,
                superseded_by=old.superseded_by,
            ),
            created,
        )

    def _recorded(self, write: MemoryWrite, result: WriteResult) -> WriteResult:
        if write.request_id is not None:
            self._requests[(write.namespace, write.request_id)] = (
                write.payload_hash,
                result.memory.memory_id,
                result.memory.revision,
                result.created,
                self.now(),
            )
        return result

    async def create(self, write: MemoryWrite) -> WriteResult:
        async with self._lock:
            replayed = self._fence(write)
            if replayed is not None:
                return replayed
            key = (write.namespace, write.memory_id)
            existing = self._memories.get(key)
            if existing is not None:
                if self._live(existing):
                    raise memory_exists()
                self._erase(key, "expired")
            history = self._history.get(key, [])
            now = self.now()
            memory = Memory(
                write.namespace,
                write.memory_id,
                write.content,
                tuple(write.sources),
                dict(write.metadata),
                (history[-1].revision if history else 0) + 1,
                now,
                now,
                write.expire_time,
                write.embedding_model,
                write.embedding_dimension,
                valid_from_time=write.valid_from_time or now,
                valid_until_time=write.valid_until_time,
            )
            return self._write(write, memory, "create", True)

    async def update(self, write: MemoryWrite) -> WriteResult:
        async with self._lock:
            replayed = self._fence(write)
            if replayed is not None:
                return replayed
            key = (write.namespace, write.memory_id)
            existing = self._memories.get(key)
            if existing is None or not self._live(existing):
                raise memory_not_found()
            if existing.revision != write.expected_revision:
                assert write.expected_revision is not None
                raise revision_conflict(existing.revision, write.expected_revision)
            memory = replace(
                existing,
                content=write.content,
                sources=tuple(write.sources),
                metadata=dict(write.metadata),
                revision=existing.revision + 1,
                update_time=self.now(),
                expire_time=write.expire_time,
                embedding_model=write.embedding_model,
                embedding_dimension=write.embedding_dimension,
                valid_from_time=write.valid_from_time or existing.valid_from_time,
                valid_until_time=write.valid_until_time or existing.valid_until_time,
            )
            assert memory.valid_from_time is not None
            if memory.valid_until_time is not None and (
                memory.valid_until_time <= memory.valid_from_time
            ):
                raise invalid_validity()
            return self._write(write, memory, "update", False)

    async def get(self, namespace: str, memory_id: uuid.UUID) -> Memory | None:
        memory = self._memories.get((namespace, memory_id))
        return memory if memory is not None and self._live(memory) else None

    async def get_many(
        self,
        namespace: str,
        memory_ids: Sequence[uuid.UUID],
        metadata: Mapping[str, str],
        valid_at: datetime | None = None,
    ) -> list[Memory]:
        found = []
        for memory_id in dict.fromkeys(memory_ids):
            memory = await self.get(namespace, memory_id)
            if (
                memory is not None
                and all(memory.metadata.get(k) == v for k, v in metadata.items())
                and self._valid(memory, valid_at)
            ):
                found.append(memory)
        return found

    async def list_memories(
        self,
        namespace: str,
        conversation_id: uuid.UUID | None,
        after: uuid.UUID | None,
        limit: int,
        valid_at: datetime | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> list[Memory]:
        rows = sorted(
            (
                m
                for (ns, _), m in self._memories.items()
                if ns == namespace
                and self._live(m)
                and self._valid(m, valid_at)
                and (after is None or m.memory_id > after)
                and all(m.metadata.get(k) == v for k, v in (metadata or {}).items())
                and (
                    conversation_id is None
                    or any(
                        isinstance(s, MemorySource) and s.conversation_id == conversation_id
                        for s in m.sources
                    )
                )
            ),
            key=lambda m: m.memory_id,
        )
        return rows[:limit]

    async def delete(
        self, namespace: str, memory_id: uuid.UUID, expected_revision: int | None
    ) -> bool:
        async with self._lock:
            key = (namespace, memory_id)
            memory = self._memories.get(key)
            if memory is None:
                return False
            if expected_revision is not None:
                if not self._live(memory):
                    return False
                if memory.revision != expected_revision:
                    raise revision_conflict(memory.revision, expected_revision)
            return self._erase(key, "delete")

    async def forget_source(
        self, namespace: str, conversation_id: uuid.UUID, low: int, high: int, incarnation: int = 0
    ) -> Forgotten:
        async with self._lock:
            victims = [
                key
                for key, m in self._memories.items()
                if key[0] == namespace
                and any(
                    isinstance(s, MemorySource)
                    and s.conversation_id == conversation_id
                    and s.from_sequence <= high
                    and s.through_sequence >= low
                    for s in m.sources
                )
            ]
            revisions = 0
            for key in victims:
                self._erase(key, "forget_source")
                revisions += self._blanked
            if not incarnation:
                return Forgotten(len(victims))
            tombstone = (namespace, conversation_id, incarnation)
            self._erased.add(tombstone)
            before = self._erasures.get(tombstone) or MemoryErasure(
                conversation_id, incarnation, 0, 0, 0, self.now()
            )
            self._erasures[tombstone] = replace(
                before,
                memories_deleted=before.memories_deleted + len(victims),
                revisions_erased=before.revisions_erased + revisions,
                index_points=before.index_points + len(victims),
            )
            if victims and self._outbox:
                self._outbox_through[tombstone] = self._outbox[-1][0].seq
            return Forgotten(len(victims), self._caught_up(tombstone))

    def _caught_up(self, tombstone: tuple[str, uuid.UUID, int]) -> MemoryErasure | None:
        """The erasure, its index completion recorded once no outbox row at or below its
        position is left."""
        erasure = self._erasures.get(tombstone)
        if erasure is None or erasure.index_complete_time is not None:
            return erasure
        through = self._outbox_through.get(tombstone)
        if through is None or all(entry.seq > through for entry, _ in self._outbox):
            erasure = replace(erasure, index_complete_time=self.now())
            self._erasures[tombstone] = erasure
        return erasure

    async def forget_external(self, namespace: str, uri: str) -> int:
        async with self._lock:
            victims = [
                key
                for key, m in self._memories.items()
                if key[0] == namespace and ExternalSource(uri) in m.sources
            ]
            for key in victims:
                self._erase(key, "forget_source")
            return len(victims)

    async def erasure(
        self, namespace: str, conversation_id: uuid.UUID, incarnation: int
    ) -> MemoryErasure | None:
        async with self._lock:
            return self._caught_up((namespace, conversation_id, incarnation))

    async def erased(self, namespace: str, conversation_id: uuid.UUID, incarnation: int) -> bool:
        return (namespace, conversation_id, incarnation) in self._erased

    async def sweep_requests(self, older_than_s: float) -> int:
        async with self._lock:
            cutoff = self.now() - timedelta(seconds=older_than_s)
            old = [key for key, value in self._requests.items() if value[4] < cutoff]
            for key in old:
                del self._requests[key]
            return len(old)

    async def sweep_expired(self, limit: int) -> int:
        async with self._lock:
            victims = [k for k, m in self._memories.items() if not self._live(m)][:limit]
            for key in victims:
                self._erase(key, "expired")
            return len(victims)

    async def text_search(
        self,
        namespace: str,
        query: str,
        metadata: Mapping[str, str],
        limit: int,
        valid_at: datetime | None = None,
    ) -> list[ScoredMemory]:
        words = set(_WORD.findall(query.lower()))
        hits = []
        for (ns, _), memory in self._memories.items():
            if ns != namespace or not self._live(memory) or not self._valid(memory, valid_at):
                continue
            if any(memory.metadata.get(k) != v for k, v in metadata.items()):
                continue
            overlap = len(words & set(_WORD.findall(memory.content.lower())))
            if overlap:
                hits.append(ScoredMemory(memory, overlap / (len(words) or 1)))
        hits.sort(key=lambda h: (-h.score, h.memory.memory_id))
        return hits[:limit]

    async def history(
        self,
        namespace: str,
        memory_id: uuid.UUID,
        after_revision: int = 0,
        limit: int | None = None,
    ) -> list[RevisionRecord]:
        rows = [
            r for r in self._history.get((namespace, memory_id), []) if r.revision > after_revision
        ]
        return rows if limit is None else rows[:limit]

    async def claim_outbox(self, limit: int, lease_s: float) -> OutboxClaim | None:
        async with self._lock:
            now = self.now()
            entries = [
                entry
                for entry, _ in self._outbox
                if entry.seq not in self._claims or self._claims[entry.seq][1] < now
            ][:limit]
            if not entries:
                return None
            token = uuid.uuid4()
            for entry in entries:
                self._claims[entry.seq] = (token, now + timedelta(seconds=lease_s))
            current: dict[Key, Memory] = {}
            deleted: dict[Key, int] = {}
            for entry in entries:
                key = (entry.namespace, entry.memory_id)
                memory = self._memories.get(key)
                if memory is not None and self._live(memory):
                    current[key] = memory
                else:
                    history = self._history.get(key, [])
                    deleted[key] = history[-1].revision if history else 0
            return OutboxClaim(token, entries, current, deleted)

    def _held(self, claim: OutboxClaim) -> set[int]:
        return {s for s in claim.seqs if self._claims.get(s, (None,))[0] == claim.token}

    async def complete_outbox(
        self, claim: OutboxClaim, reembedded: Sequence[Key], model: str, dimension: int
    ) -> int:
        async with self._lock:
            held = self._held(claim)
            self._outbox = [(e, t) for e, t in self._outbox if e.seq not in held]
            for seq in held:
                del self._claims[seq]
        await self.set_embedding(reembedded, model, dimension)
        return len(held)

    async def release_outbox(self, claim: OutboxClaim) -> None:
        async with self._lock:
            for seq in self._held(claim):
                del self._claims[seq]

    async def backlog(self) -> OutboxDepth:
        if not self._outbox:
            return OutboxDepth(0, 0.0)
        return OutboxDepth(len(self._outbox), (self.now() - self._outbox[0][1]).total_seconds())

    async def scan(self, after: Key | None, limit: int) -> list[Memory]:
        keys = sorted(
            k for k, m in self._memories.items() if self._live(m) and (after is None or k > after)
        )
        return [self._memories[k] for k in keys[:limit]]

    async def set_embedding(self, keys: Sequence[Key], model: str, dimension: int) -> None:
        for key in keys:
            memory = self._memories.get(key)
            if memory is not None:
                self._memories[key] = replace(
                    memory, embedding_model=model, embedding_dimension=dimension
                )

    async def memory_count(self) -> int:
        """Live memories."""
        return sum(1 for m in self._memories.values() if self._live(m))
