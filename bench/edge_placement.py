"""Resident memory and search cost of the Edge shard's memory placement.

Two placements of the same 100,000 points (384 random unit vectors, 100
namespaces, the namespace keyword index as the service makes it), each in a
fresh interpreter: `cached` (the full vectors held in memory, as before) and
`bounded` (EdgeIndex's own: full vectors cold on disk, an int8 copy pinned,
the HNSW graph cached, rescoring on the full vectors). Prints anonymous and
file-backed RSS growth after writing, after optimizing and after 200 filtered
searches, the filtered top-10 p50 and its recall against exact search. Takes
minutes (the HNSW build); not part of `make bench`.

    python -m bench.edge_placement [--points 100000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import qdrant_edge as qe

from services.memory.index.edge import _RESCORED, EdgeIndex

_DIMENSION = 384
_NAMESPACES = 100


def _rss() -> tuple[float, float]:
    values = {}
    with open(f"/proc/{os.getpid()}/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in {"RssAnon", "RssFile"}:
                values[key] = int(rest.split()[0]) / 1024
    return values["RssAnon"], values["RssFile"]


def _config(placement: str) -> qe.EdgeConfig:
    if placement == "bounded":
        config: qe.EdgeConfig = EdgeIndex(Path(), "bench", _DIMENSION)._config()
        return config
    return qe.EdgeConfig(
        vectors=qe.EdgeVectorParams(_DIMENSION, qe.Distance.Cosine),
        payload_memory=qe.Memory.Cached,
    )


def measure(placement: str, points: int) -> str:
    rng = np.random.default_rng(1)
    vectors = rng.standard_normal((points, _DIMENSION)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    start = _rss()

    def grown() -> str:
        anon, file = (now - then for now, then in zip(_rss(), start, strict=True))
        return f"anon {anon:4.0f} MiB file {file:4.0f} MiB"

    with tempfile.TemporaryDirectory() as directory:
        shard = qe.EdgeShard.create(directory, _config(placement))
        shard.update(
            qe.UpdateOperation.create_field_index(
                "namespace", qe.KeywordIndexParams(is_tenant=True)
            )
        )
        for first in range(0, points, 256):
            shard.update(
                qe.UpdateOperation.upsert_points(
                    [
                        qe.Point(
                            str(uuid.UUID(int=j + 1)),
                            vectors[j].tolist(),
                            {"namespace": f"ns-{j % _NAMESPACES}", "revision": 1},
                        )
                        for j in range(first, min(points, first + 256))
                    ]
                )
            )
        written = grown()
        shard.optimize()
        optimized = grown()
        queries = rng.standard_normal((200, _DIMENSION)).astype(np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        latencies, recalls = [], []
        for k, query in enumerate(queries):
            namespace = k % _NAMESPACES
            request = qe.QueryRequest(
                limit=10,
                query=qe.Query.Nearest(query.tolist()),
                filter=qe.Filter(
                    must=[
                        qe.FieldCondition(key="namespace", match=qe.MatchValue(f"ns-{namespace}"))
                    ]
                ),
                params=_RESCORED if placement == "bounded" else None,
            )
            began = time.perf_counter()
            found = shard.query(request)
            latencies.append((time.perf_counter() - began) * 1000)
            members = np.arange(namespace, points, _NAMESPACES)
            best = members[np.argsort(-(vectors[members] @ query))[:10]]
            exact = {str(uuid.UUID(int=int(j) + 1)) for j in best}
            recalls.append(len(exact & {str(p.id) for p in found}) / 10)
        searched = grown()
        shard.close()
    return (
        f"{placement:<8} {points:,} points | written: {written} | optimized: {optimized} | "
        f"after search: {searched} | filtered top-10 p50 {statistics.median(latencies):.2f} ms, "
        f"recall@10 {float(np.mean(recalls)):.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--placement", choices=("cached", "bounded"))
    args = parser.parse_args()
    if args.placement:
        print(measure(args.placement, args.points), flush=True)
        return
    for placement in ("cached", "bounded"):  # each in its own process: RSS is per process
        subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.edge_placement",
                "--points",
                str(args.points),
                "--placement",
                placement,
            ],
            check=True,
        )


if __name__ == "__main__":
    main()
