"""Helpers of the memory tests: configuration, fakes for domain unit tests, and servers.

The fakes stand in only where a test is about the domain's rules: a
deterministic bag-of-words embedder, a brute-force index, and a source
checker with a fixed transcript map. Everything the issue asks to show runs
on the real model, real PostgreSQL, real Qdrant engines and real servers.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from services.common.domain import Entry, Message, Role
from services.common.server import RunningServer, serving
from services.common.settings import Settings
from services.memory.component import MemoryComponent
from services.memory.config import MemoryConfig
from services.memory.embeddings.protocol import Embedder
from services.memory.index.model import IndexHit, IndexPoint, NamespacedQuery, Tombstone, ValidAt
from services.memory.index.protocol import IndexMismatch, IndexUnavailable, VectorIndex
from services.memory.model import Key, SourceConversation
from services.memory.proposals.proposer import Proposer
from services.memory.search.lexical import Scored, SearchMode, fuse
from services.transcript.component import TranscriptComponent
from tests.support.settings import server_settings

_WORD = re.compile(r"\w+")


def memory_config(index_dir: Path | None = None, **overrides: object) -> MemoryConfig:
    """A configuration for tests: fast polls, short backoff, Edge under `index_dir`."""
    base = MemoryConfig(
        index="edge",
        index_dir=index_dir,
        indexer_poll_s=0.05,
        indexer_backoff_max_s=0.2,
        sweep_interval_s=0.1,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


class HashEmbedder:
    """Bag of hashed words, normalised: texts sharing words are close. Deterministic."""

    model = "test/hash-words"
    dimension = 64

    def __init__(self) -> None:
        self.calls = 0

    async def start(self) -> None:
        return None

    def vector(self, text: str) -> list[float]:
        vector = [0.0] * self.dimension
        for word in _WORD.findall(text.lower()):
            slot = int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "big")
            vector[slot % self.dimension] += 1.0
        norm = math.sqrt(sum(x * x for x in vector)) or 1.0
        return [x / norm for x in vector]

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.calls += 1
        return [self.vector(t) for t in texts]

    async def close(self) -> None:
        return None


class BruteForceIndex:
    """An exact in-process index that can be switched off (an outage). It keeps the
    adapters' revision guard: an older write never lands, a tombstone blocks older
    points until pruned."""

    name = "brute-force"

    def __init__(self, dimension: int) -> None:
        self.dimension = dimension
        self.points: dict[Key, IndexPoint] = {}
        # key -> (revision, when written: time.monotonic()).
        self.tombstones: dict[Key, tuple[int, float]] = {}
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise IndexUnavailable("switched off by the test")

    def _held(self, key: Key) -> int:
        if key in self.points:
            return self.points[key].revision
        return self.tombstones.get(key, (-1, 0.0))[0]  # -1: nothing held

    async def start(self) -> None:
        self._check()

    async def upsert(self, points: Sequence[IndexPoint]) -> None:
        self._check()
        for p in points:
            if len(p.vector) != self.dimension:
                raise IndexMismatch("dimension")
        for p in points:
            key = (p.namespace, p.memory_id)
            if self._held(key) < p.revision:
                self.tombstones.pop(key, None)
                self.points[key] = p

    async def delete(self, tombstones: Sequence[Tombstone]) -> None:
        self._check()
        for t in tombstones:
            key = (t.namespace, t.memory_id)
            if self._held(key) <= t.revision:
                self.points.pop(key, None)
                self.tombstones[key] = (t.revision, time.monotonic())

    async def purge(self, keys: Sequence[Key]) -> None:
        self._check()
        for key in keys:
            self.points.pop(key, None)
            self.tombstones.pop(key, None)

    async def prune_tombstones(self, older_than_s: float) -> None:
        self._check()
        cutoff = time.monotonic() - older_than_s
        self.tombstones = {k: v for k, v in self.tombstones.items() if v[1] > cutoff}

    async def search(self, query: NamespacedQuery) -> list[IndexHit]:
        self._check()
        return reference_search(self.points.values(), query)

    async def keys(self) -> set[Key]:
        self._check()
        return set(self.points)

    async def optimize(self) -> None:
        return None

    async def close(self) -> None:
        return None


def _matches(p: IndexPoint, query: NamespacedQuery) -> bool:
    payload = p.payload()
    return all(
        t.matches(p.valid_from, p.valid_end)
        if isinstance(t, ValidAt)
        else payload[t.field] == t.value
        or (isinstance(payload[t.field], list) and t.value in payload[t.field])  # type: ignore[operator]
        for t in query.terms
    )


def reference_bm25(points: Iterable[IndexPoint], query: NamespacedQuery) -> dict[Key, float]:
    """BM25 as every adapter computes it (services/memory/search/lexical.py): the IDF over the
    namespace's points with a lexical vector, each point's score the sum of idf x weight
    over the query terms it has. Only the points sharing a term."""
    corpus = [p for p in points if p.namespace == query.namespace and p.lexical is not None]
    df: dict[int, int] = {}
    for p in corpus:
        assert p.lexical is not None
        for i in p.lexical.indices:
            df[i] = df.get(i, 0) + 1
    n = len(corpus)
    idf = {t: math.log(1 + (n - df.get(t, 0) + 0.5) / (df.get(t, 0) + 0.5)) for t in query.lexical}
    scores: dict[Key, float] = {}
    for p in corpus:
        assert p.lexical is not None
        weights = dict(zip(p.lexical.indices, p.lexical.values, strict=True))
        shared = [t for t in query.lexical if t in weights]
        if shared and _matches(p, query):
            scores[(p.namespace, p.memory_id)] = sum(idf[t] * weights[t] for t in shared)
    return scores


def reference_search(points: Iterable[IndexPoint], query: NamespacedQuery) -> list[IndexHit]:
    """Exact search in the query's mode, as the adapters rank: dense by cosine, lexical by
    BM25, hybrid from both sides' top `limit` rescored by both and fused."""
    held = [p for p in points if _matches(p, query)]
    by_key = {(p.namespace, p.memory_id): p for p in held}
    cosine = {
        k: sum(a * b for a, b in zip(query.vector, p.vector, strict=True))
        for k, p in by_key.items()
    }
    if query.mode is SearchMode.DENSE:
        top = sorted(cosine.items(), key=lambda kv: -kv[1])[: query.limit]
        return [IndexHit(k[1], by_key[k].revision, s, dense=s) for k, s in top]
    bm25 = reference_bm25(held, query) if query.lexical else {}
    if query.mode is SearchMode.LEXICAL:
        top = sorted(bm25.items(), key=lambda kv: -kv[1])[: query.limit]
        return [IndexHit(k[1], by_key[k].revision, s, lexical=s) for k, s in top]
    dense_top = [k for k, _ in sorted(cosine.items(), key=lambda kv: -kv[1])[: query.limit]]
    lexical_top = [k for k, _ in sorted(bm25.items(), key=lambda kv: -kv[1])[: query.limit]]
    candidates = [
        Scored(k[1], cosine[k], bm25.get(k, 0.0)) for k in dict.fromkeys(dense_top + lexical_top)
    ]
    revision = {k[1]: p.revision for k, p in by_key.items()}
    return [
        IndexHit(c.key, revision[c.key], fused, dense=c.dense, lexical=c.lexical)
        for c, fused in fuse(candidates, query.fusion)[: query.limit]
    ]


# When the entries of FixedSources were written: entry n at EPOCH + n hours.
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def entry_time(sequence: int) -> datetime:
    """The create time of entry `sequence` of every FixedSources conversation."""
    return EPOCH + timedelta(hours=sequence)


class FixedSources:
    """SourceChecker over a map of (namespace, conversation id) -> last sequence (each
    conversation's incarnation is 1, and one more each time it is made again). Entry n
    says `texts[n]` if given (else "message n"), from the user, written at
    `entry_time(n)`."""

    def __init__(self) -> None:
        self.conversations: dict[tuple[str, uuid.UUID], int] = {}
        self.texts: dict[tuple[str, uuid.UUID], list[str]] = {}
        self.incarnations: dict[tuple[str, uuid.UUID], int] = {}
        # What curation marked (MarkCurated), by conversation.
        self.curated: dict[tuple[str, uuid.UUID], int] = {}
        # Conversations asked for (a memory of external sources only asks for none).
        self.asked = 0

    def add(self, namespace: str, last_sequence: int, texts: Sequence[str] = ()) -> str:
        cid = uuid.uuid4()
        self.conversations[(namespace, cid)] = max(last_sequence, len(texts))
        self.texts[(namespace, cid)] = list(texts)
        self.incarnations[(namespace, cid)] = 1
        return str(cid)

    def erase(self, namespace: str, conversation_id: str) -> None:
        """The transcript deleted (its incarnation is remembered, never reused)."""
        key = (namespace, uuid.UUID(conversation_id))
        del self.conversations[key], self.texts[key]

    def make_again(self, namespace: str, conversation_id: str, texts: Sequence[str]) -> int:
        """The id made again (after `erase`) with other entries; returns its incarnation."""
        key = (namespace, uuid.UUID(conversation_id))
        assert key not in self.conversations, "erase it first"
        self.conversations[key] = len(texts)
        self.texts[key] = list(texts)
        self.incarnations[key] += 1
        return self.incarnations[key]

    async def conversation(
        self, namespace: str, conversation_id: uuid.UUID
    ) -> SourceConversation | None:
        self.asked += 1
        key = (namespace, conversation_id)
        last = self.conversations.get(key)
        return SourceConversation(last, self.incarnations[key]) if last is not None else None

    async def entries(
        self, namespace: str, conversation_id: uuid.UUID, from_sequence: int, through_sequence: int
    ) -> Sequence[Entry]:
        last = self.conversations.get((namespace, conversation_id))
        if last is None:
            return []
        texts = self.texts[(namespace, conversation_id)]
        return [
            Entry(
                n,
                Message(Role.USER, texts[n - 1] if n <= len(texts) else f"message {n}"),
                entry_time(n),
            )
            for n in range(max(1, from_sequence), min(last, through_sequence) + 1)
        ]

    async def mark_curated(
        self, namespace: str, conversation_id: uuid.UUID, incarnation: int, curated_through: int
    ) -> None:
        self.curated[(namespace, conversation_id)] = curated_through

    async def retracted(
        self,
        namespace: str,
        conversation_id: uuid.UUID,
        after_version: int,
        through_sequence: int,
    ) -> list[int]:
        return []  # FixedSources' entries are never retracted


async def outbox_drained(component: MemoryComponent) -> bool:
    """True once the indexer has applied every memory write (the outbox is empty)."""
    assert component.store is not None
    return (await component.store.backlog()).depth == 0


@asynccontextmanager
async def memory_server(
    database_url: str,
    config: MemoryConfig,
    *,
    index: VectorIndex | None = None,
    embedder: Embedder | None = None,
    background: bool = True,
    settings: Settings | None = None,
    proposer: Proposer | None = None,
) -> AsyncIterator[tuple[RunningServer, MemoryComponent]]:
    """TranscriptService and MemoryService in one real gRPC server on 127.0.0.1:0; memory
    validates sources through TranscriptService's gRPC API (all-in-one addressing)."""
    component = MemoryComponent(
        config, index=index, embedder=embedder, background=background, proposer=proposer
    )
    async with serving(
        [TranscriptComponent(), component],
        settings or server_settings(),
        database_url=database_url,
        extras={"all_in_one": True},
    ) as running:
        yield running, component
