"""Search modes (issue 21): recall on the labelled set, and SearchMemories p50 per mode.

1. Recall@5 and @10 of dense, lexical and hybrid search on every back-end (Qdrant
   Edge, qdrant-client's local mode, pgvector), by question kind, on the labelled set
   of tests/memory/search/retrieval_set.py (facts embedded with the real model). Each search
   asks the index for limit x 2 + 8 candidates and keeps the first 10, as the service
   does. Hybrid runs over a sweep of fusion weights (score fusion) and with RRF; the
   weight with the best recall@5 overall (averaged over back-ends) is the one
   reported per kind, beside the configured default. Goals: hybrid recall@5 at least
   0.03 above dense overall, no kind more than 0.05 below dense.
2. SearchMemories p50 through gRPC (a server process, query embedding included) at
   BENCH_RETRIEVAL_SIZE (default 100,000) memories over 100 namespaces, for each mode,
   on Edge and pgvector; the corpus of bench/memory.py (derived vectors, real texts)
   with its BM25 vectors. Modes alternate over BENCH_MEMORY_ROUNDS rounds. Goal:
   hybrid p50 within 1.2x of dense.

`python -m bench retrieval` runs both; `retrieval-quality` the first alone.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections import defaultdict
from pathlib import Path

import numpy as np

from bench import memory as memory_bench
from bench.common import Stats, new_database, server_process
from runifold.memory.v1 import memory_service_pb2 as pb
from services.memory.config import LOCAL_MODEL_DIMENSION, LOCAL_MODEL_NAME, MemoryConfig
from services.memory.embeddings.local import LocalEmbedder
from services.memory.index.edge import EdgeIndex
from services.memory.index.model import IndexPoint, NamespacedQuery
from services.memory.index.pgvector.adapter import PgvectorIndex
from services.memory.index.protocol import VectorIndex
from services.memory.index.qdrant.adapter import QdrantIndex
from services.memory.search import lexical
from services.memory.search.lexical import Fusion, FusionMethod, SearchMode
from tests.memory.search.retrieval_set import KINDS, retrieval_set

WEIGHTS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
BACKENDS = ("edge", "qdrant", "pgvector")


async def _open(backend: str, postgres_url: str, folder: Path) -> VectorIndex:
    index: VectorIndex
    if backend == "edge":
        index = EdgeIndex(folder / "edge", LOCAL_MODEL_NAME, LOCAL_MODEL_DIMENSION)
    elif backend == "qdrant":
        index = QdrantIndex(LOCAL_MODEL_NAME, LOCAL_MODEL_DIMENSION, path=str(folder / "qdrant"))
    else:
        index = PgvectorIndex(new_database(postgres_url), LOCAL_MODEL_NAME, LOCAL_MODEL_DIMENSION)
    await index.start()
    return index


def _recall(found: list[uuid.UUID], answers: tuple[uuid.UUID, ...], k: int) -> float:
    return len(set(found[:k]) & set(answers)) / len(answers)


Setting = tuple[str, str]  # (mode label, backend)


async def recalls(postgres_url: str) -> tuple[dict[Setting, dict[str, list[float]]], int, int]:
    """recall@5 and @10 per (setting, backend) and question kind: {(label, backend):
    {"kind@k": [...]}}; and the counts of facts and questions."""
    facts, questions = retrieval_set()
    embedder = LocalEmbedder()
    fact_vectors = np.asarray(embedder.encode([f.text for f in facts]), dtype=np.float32)
    question_vectors = np.asarray(embedder.encode([q.text for q in questions]), dtype=np.float32)
    ids = {f.key: uuid.uuid5(uuid.NAMESPACE_URL, f.key) for f in facts}
    points = [
        IndexPoint(f.namespace, ids[f.key], 1, v.tolist(), {}, lexical=lexical.document(f.text))
        for f, v in zip(facts, fact_vectors, strict=True)
    ]
    settings: list[tuple[str, SearchMode, Fusion]] = [
        ("dense", SearchMode.DENSE, Fusion()),
        ("lexical", SearchMode.LEXICAL, Fusion()),
        *[(f"hybrid w={w}", SearchMode.HYBRID, Fusion(weight=w)) for w in WEIGHTS],
        ("hybrid rrf", SearchMode.HYBRID, Fusion(FusionMethod.RRF, 0.5, 60)),
    ]
    out: dict[Setting, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    candidates = 10 * MemoryConfig().overfetch + 8
    with tempfile.TemporaryDirectory(prefix="runifold-bench-retrieval-") as tmp:
        for backend in BACKENDS:
            index = await _open(backend, postgres_url, Path(tmp))
            try:
                await index.upsert(points)
                for question, vector in zip(questions, question_vectors, strict=True):
                    answers = tuple(ids[a] for a in question.answers)
                    terms = lexical.query_terms(question.text)
                    for label, mode, fusion in settings:
                        hits = await index.search(
                            NamespacedQuery.inside(
                                question.namespace,
                                vector.tolist(),
                                candidates,
                                mode=mode,
                                lexical=terms,
                                fusion=fusion,
                            )
                        )
                        found = [h.memory_id for h in hits][:10]
                        for k in (5, 10):
                            value = _recall(found, answers, k)
                            out[(label, backend)][f"{question.kind}@{k}"].append(value)
                            out[(label, backend)][f"all@{k}"].append(value)
            finally:
                await index.close()
    return out, len(facts), len(questions)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


async def quality(postgres_url: str) -> list[str]:
    """Part 1 alone."""
    results, fact_count, question_count = await recalls(postgres_url)
    _, questions = retrieval_set()
    per_kind = {kind: sum(1 for q in questions if q.kind == kind) for kind in KINDS}
    lines = [
        "## Memory search modes (issue 21): recall on the labelled set",
        "",
        f"{fact_count} facts in 2 namespaces, {question_count} questions ("
        + ", ".join(f"{kind} {n}" for kind, n in per_kind.items())
        + "); the real model; each search takes the index's first 10 of 28 candidates",
        "",
    ]
    # The weight: best recall@5 overall, averaged over the back-ends.
    overall = {
        w: _mean([_mean(results[(f"hybrid w={w}", b)]["all@5"]) for b in BACKENDS]) for w in WEIGHTS
    }
    best = max(WEIGHTS, key=lambda w: (overall[w], -abs(w - 0.3)))
    lines.append(
        "hybrid recall@5 overall by weight (mean of back-ends): "
        + ", ".join(f"w={w} {overall[w]:.3f}" for w in WEIGHTS)
        + f"; best w={best}"
    )
    lines.append("")
    default = MemoryConfig().hybrid_weight
    labels = ["dense", "lexical", f"hybrid w={default}", "hybrid rrf"]
    if best != default:
        labels.insert(3, f"hybrid w={best}")
    header = "| back-end | mode | " + " | ".join(f"{k} @5 / @10" for k in ("all", *KINDS)) + " |"
    lines += [header, "|" + "---|" * (len(KINDS) + 3)]
    for backend in BACKENDS:
        for label in labels:
            row = results[(label, backend)]
            cells = [
                f"{_mean(row[f'{kind}@5']):.3f} / {_mean(row[f'{kind}@10']):.3f}"
                for kind in ("all", *KINDS)
            ]
            lines.append(f"| {backend} | {label} | " + " | ".join(cells) + " |")
    lines.append("")
    for backend in BACKENDS:
        dense = results[("dense", backend)]
        hybrid = results[(f"hybrid w={default}", backend)]
        gain = _mean(hybrid["all@5"]) - _mean(dense["all@5"])
        worst = min(
            (_mean(hybrid[f"{kind}@5"]) - _mean(dense[f"{kind}@5"]), kind) for kind in KINDS
        )
        lines.append(
            f"{backend}: hybrid (w={default}) - dense recall@5 = {gain:+.3f} (goal >= +0.03); "
            f"worst kind {worst[1]} {worst[0]:+.3f} (goal >= -0.05)"
        )
    return lines


async def latency(postgres_url: str) -> list[str]:
    """Part 2: SearchMemories p50 per mode at BENCH_RETRIEVAL_SIZE memories."""
    size = int(os.environ.get("BENCH_RETRIEVAL_SIZE", "100000"))
    backends = os.environ.get("BENCH_MEMORY_BACKENDS", "edge,pgvector").split(",")
    query_count = int(os.environ.get("BENCH_MEMORY_QUERIES", "200"))
    rounds = int(os.environ.get("BENCH_MEMORY_ROUNDS", "2"))
    embedder = LocalEmbedder()
    texts = memory_bench.base_texts(memory_bench.BASE_TEXTS)
    base = np.asarray(embedder.encode(texts), dtype=np.float32)
    queries = memory_bench.questions(query_count)
    query_vectors = np.asarray(embedder.encode(queries), dtype=np.float32)
    modes = {
        "dense": pb.SEARCH_MODE_DENSE,
        "lexical": pb.SEARCH_MODE_LEXICAL,
        "hybrid": pb.SEARCH_MODE_HYBRID,
    }
    lines = [
        f"## SearchMemories p50 per mode at {size:,} memories (gRPC, query embedding included)",
        "",
    ]
    corpus = memory_bench.Corpus(size, texts, base)
    with tempfile.TemporaryDirectory(prefix="runifold-bench-retrieval-") as tmp:
        for backend in backends:
            url = new_database(postgres_url)
            await memory_bench.load_postgres(url, corpus)
            shard_dir = Path(tmp) / backend
            load_s = await memory_bench.load_index(backend, url, shard_dir, corpus, lexical=True)
            pooled: dict[str, Stats] = {m: Stats(m, [], 0.0) for m in modes}
            env = {
                "RUNIFOLD_MEMORY_INDEX": backend,
                "RUNIFOLD_MEMORY_INDEX_DIR": str(shard_dir),
                "TRANSCRIPT_SERVICE_ADDR": "127.0.0.1:1",  # searches need no transcript
            }
            async with server_process("services.memory", url, env) as address:
                for _ in range(rounds):
                    for name, mode in modes.items():
                        stats, _recall = await memory_bench.search_run(
                            address, corpus, queries, query_vectors, mode
                        )
                        pooled[name].latencies += stats.latencies
                        pooled[name].elapsed += stats.elapsed
            for name, stats in pooled.items():
                stats.name = f"{backend} {name}"
                lines.append(stats.row())
            ratio = pooled["hybrid"].p50 / pooled["dense"].p50
            lines.append(
                f"  {backend}: hybrid p50 / dense p50 = {ratio:.2f} (goal <= 1.2); "
                f"lexical / dense = {pooled['lexical'].p50 / pooled['dense'].p50:.2f}; "
                f"index load {load_s:.0f} s"
            )
    return lines


async def run(postgres_url: str) -> list[str]:
    lines = await quality(postgres_url)
    lines.append("")
    lines += await latency(postgres_url)
    return lines
