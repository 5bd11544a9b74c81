"""MemoryService benchmarks (issue 4).

1. SearchMemories through gRPC (server in its own process, query embedding
   included) at 10,000 and 100,000 memories over 100 namespaces, on Qdrant
   Edge and on pgvector: p50, p99, and recall@10 of the answers against an
   exact brute-force search over the same vectors in the same namespace.
   Goals: recall@10 >= 0.95; p50 at 100,000 within 2x of the embedding time
   of one query alone.
2. UpsertMemory throughput through gRPC (sources validated by a
   TranscriptService process), 1 and 16 calls in flight, and how fast the
   outbox indexer embeds and indexes them (batches of 64).
   Each search run is made twice, in one run, before and after the validity
   filter of issue 17 (RUNIFOLD_MEMORY_INDEX_VALIDITY_FILTER off / on, servers
   alternating over BENCH_MEMORY_ROUNDS rounds, latencies pooled): off, the
   store's re-read alone drops facts not valid now, as before valid time
   existed; on, the engine filters on valid time too. At the biggest size a
   second corpus crowds every namespace with facts no longer valid
   (BENCH_MEMORY_SUPERSEDED, default 0.8, of the memories superseded, their
   validity closed); recall@10 there is against the exact top-10 of the valid
   facts. `python -m bench memory-validity` runs the biggest size alone.
3. Indexing rate (issue 12): memories/s from the outbox to the index, with
   1 and 2 indexers in one process (RUNIFOLD_MEMORY_INDEXERS), and on pgvector
   also 2 processes of 1 indexer, in one run. The memory processes are up and
   idle when BENCH_MEMORY_INDEXING (default 2000) memories and their outbox
   rows are committed in one transaction; the time until the outbox is empty
   is measured, and the index is checked to hold them all. The real model
   embeds every memory; two more layouts use an OpenAI-compatible embeddings
   endpoint that answers after REMOTE_EMBEDDING_S (tests/support/fake_openai.py,
   in the bench's process), where an indexer mostly waits on I/O.

Corpus: embedding 100,000 texts with the real model takes ~5 minutes on 2
CPUs, so the bench embeds BASE_TEXTS real sentences (built from templates)
and derives the rest: each memory takes a random base vector plus Gaussian
noise (sigma 0.03 per dimension, cosine about 0.86 to its base), renormalised.
Those vectors go straight into PostgreSQL (COPY) and the index; the queries
are real questions that the server embeds on every call.

Sizes: BENCH_MEMORY_SIZES (default "10000,100000"), BENCH_MEMORY_QUERIES
(default 200), BENCH_MEMORY_BACKENDS (default "edge,pgvector").
`python -m bench memory-indexing` runs part 3 alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import grpc
import numpy as np
import psycopg
from psycopg.types.json import Jsonb

from bench.common import (
    Stats,
    measure,
    new_database,
    outbox_drained,
    seed_conversation,
    server_process,
)
from bench.stats import median_ms
from runifold.memory.v1 import memory_service_pb2 as pb
from services.common import migrations, stubs
from services.common.postgres.pool import Database
from services.common.settings import Settings
from services.memory.component import MIGRATIONS
from services.memory.config import LOCAL_MODEL_DIMENSION, LOCAL_MODEL_NAME
from services.memory.embeddings.local import LocalEmbedder
from services.memory.index.edge import EdgeIndex
from services.memory.index.model import IndexPoint, collection_name, point_id
from services.memory.index.pgvector.adapter import PgvectorIndex
from services.memory.index.protocol import VectorIndex
from services.memory.search import lexical as lexical_vectors
from tests.support.fake_openai import fake_openai

NAMESPACES = 100
BASE_TEXTS = 2000
SIGMA = 0.03
SEED = 7

_SUBJECTS = [
    "The user", "The user's sister", "The user's manager", "The user's son", "The user's partner",
    "The user's neighbour", "The user's best friend", "The user's grandmother", "The team lead",
    "The user's landlord",
]  # fmt: skip
_VERBS = [
    "prefers", "is allergic to", "collects", "is learning about", "dislikes", "often cooks",
    "recently bought", "wants to avoid", "writes weekly about", "is saving money for",
]  # fmt: skip
_OBJECTS = [
    "green tea", "vintage cameras", "Italian opera", "mountain biking", "spicy food",
    "electric cars", "oil painting", "chess openings", "sourdough bread", "crime novels",
    "jazz piano", "marathon training", "birdwatching", "Japanese woodblock prints", "board games",
    "salsa dancing", "home brewing", "rock climbing", "quantum computing", "organic gardening",
]  # fmt: skip
_PLACES = [
    "in Lisbon", "at the weekend", "since 2019", "with friends", "every morning", "on holiday",
    "after work", "in the winter", "at home", "online",
]  # fmt: skip
_QUESTIONS = [
    "What does {s} like to eat?", "Which hobby does {s} have?", "What is {s} allergic to?",
    "What did {s} buy lately?", "What is {s} saving for?", "What music does {s} enjoy?",
    "Which sport is {s} into?", "What does {s} read?", "What should I avoid suggesting to {s}?",
    "What is {s} studying?",
]  # fmt: skip


def base_texts(count: int) -> list[str]:
    rng = np.random.default_rng(SEED)
    texts: set[str] = set()
    while len(texts) < count:
        texts.add(
            f"{_SUBJECTS[rng.integers(len(_SUBJECTS))]} {_VERBS[rng.integers(len(_VERBS))]} "
            f"{_OBJECTS[rng.integers(len(_OBJECTS))]} {_PLACES[rng.integers(len(_PLACES))]}."
        )
    return sorted(texts)


def questions(count: int) -> list[str]:
    rng = np.random.default_rng(SEED + 1)
    subjects = ["the user", "my sister", "my manager", "my son", "my partner", "my neighbour"]
    return [
        _QUESTIONS[rng.integers(len(_QUESTIONS))].format(s=subjects[rng.integers(len(subjects))])
        for _ in range(count)
    ]


# Valid time of the corpus: superseded facts held from 2020 to 2021, the others since 2021.
SUPERSEDED_FROM = datetime(2020, 1, 1, tzinfo=UTC)
VALID_FROM = datetime(2021, 1, 1, tzinfo=UTC)


class Corpus:
    """N memories: namespace, id, text and vector, derived from real base embeddings;
    a `superseded` fraction of them with their validity closed (no longer valid now)."""

    def __init__(
        self, size: int, texts: list[str], base: np.ndarray, superseded: float = 0.0
    ) -> None:
        rng = np.random.default_rng(SEED + size)
        pick = rng.integers(len(texts), size=size)
        noisy = base[pick] + rng.normal(scale=SIGMA, size=(size, base.shape[1]))
        self.vectors = (noisy / np.linalg.norm(noisy, axis=1, keepdims=True)).astype(np.float32)
        self.namespaces = [f"bench-{i:03d}" for i in rng.integers(NAMESPACES, size=size)]
        self.ids = [uuid.UUID(int=int(rng.integers(2**62)) << 64 | i) for i in range(size)]
        self.texts = [f"{texts[p]} (note {i})" for i, p in enumerate(pick)]
        self.superseded = rng.random(size) < superseded
        self.by_namespace: dict[str, np.ndarray] = {}
        order = np.array(self.namespaces)
        for ns in sorted(set(self.namespaces)):
            self.by_namespace[ns] = np.flatnonzero(order == ns)
        # Each superseded fact names a valid fact of its namespace as its successor.
        self.successor: dict[int, uuid.UUID] = {}
        for rows in self.by_namespace.values():
            valid = rows[~self.superseded[rows]]
            for i in rows[self.superseded[rows]]:
                if len(valid):
                    self.successor[int(i)] = self.ids[int(valid[rng.integers(len(valid))])]

    def validity(self, i: int) -> tuple[datetime, datetime | None, uuid.UUID | None]:
        """(valid_from, valid_until, superseded_by) of memory i."""
        if self.superseded[i]:
            return SUPERSEDED_FROM, VALID_FROM, self.successor.get(i)
        return VALID_FROM, None, None

    def exact_top(self, namespace: str, query: np.ndarray, k: int) -> set[uuid.UUID]:
        """The k nearest facts valid now of the namespace."""
        rows = self.by_namespace[namespace]
        rows = rows[~self.superseded[rows]]
        scores = self.vectors[rows] @ query
        best = rows[np.argsort(-scores)[:k]]
        return {self.ids[i] for i in best}


async def load_postgres(url: str, corpus: Corpus) -> None:
    settings = Settings.from_env({"RUNIFOLD_METRICS_LISTEN": "off"})
    db = Database(url, settings)
    await db.open()
    try:
        await migrations.migrate(db, "memory", MIGRATIONS)
    finally:
        await db.close()
    source = Jsonb([{"c": str(uuid.UUID(int=1)), "f": 1, "t": 1}])
    with psycopg.connect(url, autocommit=True) as conn:
        with (
            conn.cursor() as cursor,
            cursor.copy(
                "COPY memory.memories (namespace, memory_id, content, sources, revision,"
                " embedding_model, embedding_dimension, valid_from_time, valid_until_time,"
                " superseded_by) FROM STDIN"
            ) as copy,
        ):
            for i, (ns, mid, text) in enumerate(
                zip(corpus.namespaces, corpus.ids, corpus.texts, strict=True)
            ):
                model = (LOCAL_MODEL_NAME, LOCAL_MODEL_DIMENSION)
                copy.write_row((ns, mid, text, source, 1, *model, *corpus.validity(i)))
        conn.execute("ANALYZE memory.memories")


def points(corpus: Corpus, start: int, stop: int, *, lexical: bool = False) -> list[IndexPoint]:
    """Index points of the corpus; with `lexical`, with their BM25 vectors (issue 21)."""
    made = []
    for i in range(start, stop):
        valid_from, valid_until, _ = corpus.validity(i)
        made.append(
            IndexPoint(
                corpus.namespaces[i],
                corpus.ids[i],
                1,
                corpus.vectors[i].tolist(),
                {},
                valid_from=valid_from.timestamp(),
                valid_until=valid_until.timestamp() if valid_until else None,
                lexical=lexical_vectors.document(corpus.texts[i]) if lexical else None,
            )
        )
    return made


async def load_index(
    backend: str, url: str, folder: Path, corpus: Corpus, *, lexical: bool = False
) -> float:
    """Fill the index (with `lexical`, with BM25 vectors); return the seconds it took
    (including HNSW builds)."""
    started = time.perf_counter()
    index: VectorIndex
    if backend == "edge":
        index = EdgeIndex(folder, LOCAL_MODEL_NAME, LOCAL_MODEL_DIMENSION)
        await index.start()
        for start in range(0, len(corpus.ids), 2000):
            await index.upsert(
                points(corpus, start, min(start + 2000, len(corpus.ids)), lexical=lexical)
            )
        await index.optimize()
        await index.close()
        return time.perf_counter() - started
    pg = PgvectorIndex(url, LOCAL_MODEL_NAME, LOCAL_MODEL_DIMENSION)
    await pg.start()
    await pg.close()
    # Bulk load without the HNSW index, then build it once (far faster than
    # maintaining it row by row).
    table = f"memory.{pg.table}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP INDEX memory.{pg.table}_hnsw")
        with (
            conn.cursor() as cursor,
            cursor.copy(
                f"COPY {table} (point_id, namespace, memory_id, revision, tags, embedding,"
                " valid_from, valid_until, lexical, lexical_weights) FROM STDIN"
            ) as copy,
        ):
            for point in points(corpus, 0, len(corpus.ids), lexical=lexical):
                vector = "[" + ",".join(f"{x:.6f}" for x in point.vector) + "]"
                terms = point.lexical.weights() if point.lexical else None
                copy.write_row(
                    (
                        point_id(point.namespace, point.memory_id),
                        point.namespace,
                        point.memory_id,
                        1,
                        "{}",
                        vector,
                        point.valid_from,
                        point.valid_end,
                        " ".join(f"'{t}'" for t in terms) if terms is not None else None,
                        json.dumps(terms) if terms is not None else None,
                    )
                )
        conn.execute("SET maintenance_work_mem = '1GB'")
        conn.execute("SET max_parallel_maintenance_workers = 2")
        conn.execute(
            f"CREATE INDEX {pg.table}_hnsw ON {table} USING hnsw (embedding vector_cosine_ops)"
        )
        conn.execute(f"ANALYZE {table}")
    return time.perf_counter() - started


async def search_run(
    address: str,
    corpus: Corpus,
    queries: list[str],
    query_vectors: np.ndarray,
    mode: pb.SearchMode.ValueType = pb.SEARCH_MODE_DENSE,
) -> tuple[Stats, float]:
    """p50 of SearchMemories in `mode` (dense by default: what the suite measured before
    search modes), and recall@10 against the exact dense top-10."""
    rng = np.random.default_rng(SEED + 2)
    targets = [f"bench-{i:03d}" for i in rng.integers(NAMESPACES, size=len(queries))]
    found = expected = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = stubs.memory(channel)

        async def op(_: int, i: int) -> None:
            nonlocal found, expected
            j = i % len(queries) if i >= 0 else (-i) % len(queries)
            reply = await stub.SearchMemories(
                pb.SearchMemoriesRequest(
                    namespace=targets[j], query=queries[j], limit=10, mode=mode
                )
            )
            if i >= 0:
                got = {uuid.UUID(r.memory.memory_id) for r in reply.results}
                exact = corpus.exact_top(targets[j], query_vectors[j], 10)
                found += len(got & exact)
                expected += len(exact)  # fewer than 10 where a namespace holds fewer

        stats = await measure("search", 1, len(queries), op, warmup=20)
    return stats, found / expected


@dataclass
class FilterComparison:
    """Search runs of one corpus and index, before and after the validity filter."""

    before: Stats
    before_recall: float
    after: Stats
    after_recall: float

    def rows(self, label: str) -> list[str]:
        lines = []
        for when, stats, recall in (
            ("before (filter off)", self.before, self.before_recall),
            ("after (filter on)", self.after, self.after_recall),
        ):
            stats.name = f"{label}, {when}"
            lines.append(f"{stats.row()}  recall@10 {recall:.3f}")
        lines.append(
            f"  validity filter: p50 after / before = {self.after.p50 / self.before.p50:.2f}, "
            f"recall@10 {self.before_recall:.3f} -> {self.after_recall:.3f}"
        )
        return lines


async def compare_filter(
    url: str,
    backend: str,
    shard_dir: Path,
    corpus: Corpus,
    queries: list[str],
    query_vectors: np.ndarray,
) -> FilterComparison:
    """The same searches against the same data, with the validity filter off and on:
    servers alternate over BENCH_MEMORY_ROUNDS rounds (so drift hits both), latencies
    pooled per setting."""
    rounds = int(os.environ.get("BENCH_MEMORY_ROUNDS", "2"))
    latencies: dict[str, list[float]] = {"off": [], "on": []}
    elapsed = {"off": 0.0, "on": 0.0}
    recalls: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(rounds):
        for setting in ("off", "on"):
            env = {
                "RUNIFOLD_MEMORY_INDEX": backend,
                "RUNIFOLD_MEMORY_INDEX_DIR": str(shard_dir),
                "RUNIFOLD_MEMORY_INDEX_VALIDITY_FILTER": setting,
                "TRANSCRIPT_SERVICE_ADDR": "127.0.0.1:1",  # searches need no transcript
            }
            async with server_process("services.memory", url, env) as address:
                stats, recall = await search_run(address, corpus, queries, query_vectors)
            latencies[setting] += stats.latencies
            elapsed[setting] += stats.elapsed
            recalls[setting].append(recall)
    return FilterComparison(
        Stats("before", latencies["off"], elapsed["off"]),
        sum(recalls["off"]) / rounds,
        Stats("after", latencies["on"], elapsed["on"]),
        sum(recalls["on"]) / rounds,
    )


async def crowded(
    postgres_url: str,
    folder: Path,
    size: int,
    backends: list[str],
    texts: list[str],
    base: np.ndarray,
    queries: list[str],
    query_vectors: np.ndarray,
) -> list[str]:
    """Before and after the validity filter on a corpus crowded with superseded facts."""
    fraction = float(os.environ.get("BENCH_MEMORY_SUPERSEDED", "0.8"))
    if fraction <= 0:
        return []
    corpus = Corpus(size, texts, base, superseded=fraction)
    lines = [
        "",
        f"{size:,} memories, {corpus.superseded.mean():.0%} of them superseded (validity "
        "closed, still stored and indexed); recall@10 against the exact top-10 of the "
        "valid facts",
    ]
    for backend in backends:
        url = new_database(postgres_url)
        await load_postgres(url, corpus)
        shard_dir = folder / f"{backend}-{size}-crowded"
        await load_index(backend, url, shard_dir, corpus)
        comparison = await compare_filter(url, backend, shard_dir, corpus, queries, query_vectors)
        lines += comparison.rows(f"SearchMemories {backend}, crowded")
    return lines


async def upserts(postgres_url: str, folder: Path, texts: list[str]) -> list[str]:
    url = new_database(postgres_url)
    async with server_process("services.transcript", url) as transcript_address:
        env = {
            "TRANSCRIPT_SERVICE_ADDR": transcript_address,
            "RUNIFOLD_MEMORY_INDEX": "edge",
            "RUNIFOLD_MEMORY_INDEX_DIR": str(folder / "upserts"),
            "RUNIFOLD_DB_POOL_MAX": "16",
        }
        async with (
            server_process("services.memory", url, env) as address,
            grpc.aio.insecure_channel(address) as channel,
            grpc.aio.insecure_channel(transcript_address) as tchannel,
        ):
            transcript = stubs.transcript(tchannel)
            memory = stubs.memory(channel)
            cid = await seed_conversation(transcript, "bench-upserts", ["facts"] * 8)
            source = [pb.MemorySource(conversation_id=cid, from_sequence=1, through_sequence=8)]

            async def op(_: int, i: int) -> None:
                await memory.UpsertMemory(
                    pb.UpsertMemoryRequest(
                        namespace="bench-upserts", content=texts[i % len(texts)], sources=source
                    )
                )

            single = await measure("gRPC UpsertMemory, 1 in flight", 1, 500, op)
            many = await measure("gRPC UpsertMemory, 16 in flight", 16, 2000, op)
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                started = time.perf_counter()
                await outbox_drained(conn, interval=0.1)
                drain = time.perf_counter() - started
                cursor = await conn.execute("SELECT count(*) FROM memory.memories")
                row = await cursor.fetchone()
                assert row is not None  # count(*) always answers one row
                total = int(row[0])
    end_to_end = total / (single.elapsed + many.elapsed + drain)
    return [
        single.row(),
        many.row(),
        f"outbox drained {drain:.1f} s after the last upsert; {total} memories written and "
        f"indexed (embedded in batches) end to end at {end_to_end:.0f} memories/s",
    ]


# (label, index back-end, memory processes, indexers per process, remote embeddings)
INDEXING_LAYOUTS = [
    ("edge, 1 indexer", "edge", 1, 1, False),
    ("edge, 2 indexers", "edge", 1, 2, False),
    ("pgvector, 1 indexer", "pgvector", 1, 1, False),
    ("pgvector, 2 indexers", "pgvector", 1, 2, False),
    ("pgvector, 2 processes x 1 indexer", "pgvector", 2, 1, False),
    ("pgvector, remote embeddings, 1 indexer", "pgvector", 1, 1, True),
    ("pgvector, remote embeddings, 2 indexers", "pgvector", 1, 2, True),
]
INDEXING_NAMESPACE = "bench-indexing"
REMOTE_EMBEDDING_S = 0.1
REMOTE_MODEL = "bench/remote-embedding"


async def _indexed(backend: str, url: str, folder: Path, model: str) -> int:
    """How many memories of the bench's namespace the index holds (servers stopped)."""
    if backend == "edge":
        index = EdgeIndex(folder, model, LOCAL_MODEL_DIMENSION)
        await index.start()
        try:
            return sum(1 for k in await index.keys() if k[0] == INDEXING_NAMESPACE)
        finally:
            await index.close()
    table = collection_name(model, LOCAL_MODEL_DIMENSION)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(
            f"SELECT count(*) FROM memory.{table} WHERE namespace = %s AND deleted_at IS NULL",
            (INDEXING_NAMESPACE,),
        )
        row = await cursor.fetchone()
    return int(row[0]) if row else 0


async def _index_once(
    postgres_url: str,
    folder: Path,
    texts: list[str],
    backend: str,
    processes: int,
    loops: int,
    remote: str | None,
) -> float:
    """Seconds from committing len(texts) memories with their outbox rows to an empty
    outbox; `remote`: the base URL of an OpenAI-compatible embeddings endpoint."""
    url = new_database(postgres_url)
    env = {
        "RUNIFOLD_MEMORY_INDEX": backend,
        "RUNIFOLD_MEMORY_INDEX_DIR": str(folder),
        "RUNIFOLD_MEMORY_INDEXERS": str(loops),
        "RUNIFOLD_MEMORY_INDEXER_POLL_S": "0.02",
        "TRANSCRIPT_SERVICE_ADDR": "127.0.0.1:1",  # no upserts through gRPC here
    }
    model = LOCAL_MODEL_NAME
    if remote is not None:
        model = REMOTE_MODEL
        env.update(
            RUNIFOLD_EMBEDDINGS="openai",
            RUNIFOLD_EMBEDDINGS_URL=remote,
            RUNIFOLD_EMBEDDINGS_MODEL=model,
            RUNIFOLD_EMBEDDINGS_DIMENSION=str(LOCAL_MODEL_DIMENSION),
        )
    source = Jsonb([{"c": str(uuid.UUID(int=1)), "f": 1, "t": 1}])
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(processes):
            await stack.enter_async_context(server_process("services.memory", url, env))
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            async with conn.transaction():
                await conn.execute(
                    """INSERT INTO memory.memories
                              (namespace, memory_id, content, sources, revision,
                               embedding_model, embedding_dimension)
                       SELECT %s, gen_random_uuid(), text, %s, 1, %s, %s
                         FROM unnest(%s::text[]) AS text""",
                    (INDEXING_NAMESPACE, source, model, LOCAL_MODEL_DIMENSION, texts),
                )
                await conn.execute(
                    "INSERT INTO memory.outbox (namespace, memory_id)"
                    " SELECT namespace, memory_id FROM memory.memories"
                )
            started = time.perf_counter()
            await outbox_drained(conn, interval=0.02)
            elapsed = time.perf_counter() - started
    held = await _indexed(backend, url, folder, model)
    if held != len(texts):
        raise RuntimeError(f"the index holds {held} of {len(texts)} memories")
    return elapsed


async def indexing(postgres_url: str) -> list[str]:
    """Indexing rate through the outbox with 1 and 2 indexers, in one run."""
    count = int(os.environ.get("BENCH_MEMORY_INDEXING", "2000"))
    texts = [f"{text} (note {i})" for i, text in enumerate(base_texts(BASE_TEXTS))]
    texts = (texts * (count // len(texts) + 1))[:count]
    lines = [
        "## MemoryService indexing rate (outbox to index, real model)",
        "",
        f"{count} memories committed at once with their outbox rows; batches of 64",
    ]
    rates: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="runifold-bench-indexing-") as tmp:
        async with fake_openai(embedding_dim=LOCAL_MODEL_DIMENSION) as endpoint:
            endpoint.delay = REMOTE_EMBEDDING_S
            for i, (label, backend, processes, loops, remote) in enumerate(INDEXING_LAYOUTS):
                elapsed = await _index_once(
                    postgres_url,
                    Path(tmp) / str(i),
                    texts,
                    backend,
                    processes,
                    loops,
                    endpoint.base_url if remote else None,
                )
                rates[label] = count / elapsed
                lines.append(f"{label:<42} {rates[label]:>6.0f} memories/s  ({elapsed:.2f} s)")
    lines.append(f"(remote embeddings: {REMOTE_EMBEDDING_S * 1000:.0f} ms a call of 64 texts)")
    for label, backend, processes, loops, remote in INDEXING_LAYOUTS:
        if processes * loops > 1:
            one = f"{backend}, remote embeddings, 1 indexer" if remote else f"{backend}, 1 indexer"
            lines.append(f"ratio {label} / 1 indexer: {rates[label] / rates[one]:.2f}")
    return lines


async def validity(postgres_url: str) -> list[str]:
    """Only the search runs at the biggest size, before and after the validity filter."""
    sizes = os.environ.get("BENCH_MEMORY_SIZES", "10000,100000").split(",")
    return await run(postgres_url, sizes=[max(int(s) for s in sizes)], others=False)


async def run(
    postgres_url: str, *, sizes: list[int] | None = None, others: bool = True
) -> list[str]:
    sizes = sizes or [
        int(s) for s in os.environ.get("BENCH_MEMORY_SIZES", "10000,100000").split(",")
    ]
    backends = os.environ.get("BENCH_MEMORY_BACKENDS", "edge,pgvector").split(",")
    query_count = int(os.environ.get("BENCH_MEMORY_QUERIES", "200"))
    lines = ["## MemoryService", ""]
    embedder = LocalEmbedder()
    texts = base_texts(BASE_TEXTS)
    started = time.perf_counter()
    base = np.asarray(embedder.encode(texts), dtype=np.float32)
    lines.append(
        f"corpus: {BASE_TEXTS} real sentences embedded in {time.perf_counter() - started:.1f} s; "
        f"the rest derived (base + N(0, {SIGMA}) noise, renormalised), {NAMESPACES} namespaces"
    )
    queries = questions(query_count)
    single_times = []
    for q in queries:
        t0 = time.perf_counter()
        embedder.encode([q])
        single_times.append(time.perf_counter() - t0)
    embed_p50 = median_ms(single_times)
    query_vectors = np.asarray(embedder.encode(queries), dtype=np.float32)
    lines.append(f"embedding one query alone (in process): p50 {embed_p50:.2f} ms")
    lines.append("")
    p50_at: dict[tuple[str, int], float] = {}
    with tempfile.TemporaryDirectory(prefix="runifold-bench-memory-") as tmp:
        folder = Path(tmp)
        for size in sizes:
            corpus = Corpus(size, texts, base)
            for backend in backends:
                url = new_database(postgres_url)
                await load_postgres(url, corpus)
                shard_dir = folder / f"{backend}-{size}"
                load_s = await load_index(backend, url, shard_dir, corpus)
                comparison = await compare_filter(
                    url, backend, shard_dir, corpus, queries, query_vectors
                )
                p50_at[(backend, size)] = comparison.after.p50
                lines += comparison.rows(f"gRPC SearchMemories {backend}, {size:,} memories")
                lines.append(
                    f"  recall@10 vs exact {comparison.after_recall:.3f} (goal >= 0.95); "
                    f"index load {load_s:.0f} s"
                )
        lines += await crowded(
            postgres_url, folder, max(sizes), backends, texts, base, queries, query_vectors
        )
        lines.append("")
        biggest = max(sizes)
        for backend in backends:
            if (backend, biggest) in p50_at:
                ratio = p50_at[(backend, biggest)] / embed_p50
                lines.append(
                    f"{backend}: search p50 at {biggest:,} / embedding p50 = {ratio:.2f}"
                    " (goal <= 2)"
                )
        if others:
            lines.append("")
            lines += await upserts(postgres_url, folder, texts)
    if others:
        lines.append("")
        lines += await indexing(postgres_url)
    return lines
