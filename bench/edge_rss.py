"""How much resident memory the in-process Qdrant Edge index holds per memory.

Writes points shaped as the indexer writes them (384 floats, the payload of
`IndexPoint`) into a fresh shard in batches, and prints the process's RSS growth
per point after each step, then after closing and reopening the shard. It
attributes the soak's memory growth (docs/benchmarks.md); no thresholds.

    python -m bench.edge_rss --points 6000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import uuid
from pathlib import Path

from bench.stats import rss_mib
from services.memory.index.edge import EdgeIndex
from services.memory.index.model import IndexPoint

_DIMENSION = 384
_BATCH = 20


def _rss() -> float:
    value = rss_mib(os.getpid())
    assert value is not None
    return value


async def measure(points: int, steps: int, directory: Path) -> list[str]:
    rng = random.Random(7)
    index = EdgeIndex(directory, "bench-model", _DIMENSION)
    await index.start()
    lines = [f"# Qdrant Edge RSS per point ({_DIMENSION} floats, batches of {_BATCH})", ""]
    base = _rss()
    written = 0
    per_step = max(points // steps, _BATCH)
    try:
        while written < points:
            for _ in range(per_step // _BATCH):
                await index.upsert(
                    [
                        IndexPoint(
                            f"ns-{rng.randrange(8)}",
                            uuid.uuid4(),
                            1,
                            [rng.random() for _ in range(_DIMENSION)],
                            {"topic": "bench"},
                        )
                        for _ in range(_BATCH)
                    ]
                )
                written += _BATCH
            grown = _rss() - base
            per_point = grown * 1024 / written
            lines.append(f"{written:>7} points  RSS +{grown:6.1f} MiB  {per_point:5.2f} KiB/point")
    finally:
        await index.close()
    lines.append(f"closed: RSS +{_rss() - base:.1f} MiB")
    reopened = EdgeIndex(directory, "bench-model", _DIMENSION)
    await reopened.start()
    try:
        lines.append(f"reopened from disk: RSS +{_rss() - base:.1f} MiB")
    finally:
        await reopened.close()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=6000)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="runifold-edge-rss-") as directory:
        for line in asyncio.run(measure(args.points, args.steps, Path(directory))):
            print(line)


if __name__ == "__main__":
    main()
