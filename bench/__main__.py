"""`make bench`: every benchmark suite against one real PostgreSQL; prints figures.

No thresholds are asserted: goals are printed next to the measured ratios.
`python -m bench transcript` runs one suite; `summary-claim`, `memory-indexing`,
`memory-validity`, `retrieval-quality`, `retrieval-latency` and `curation-quality`,
`-throughput`, `-claim`, `-latency` run one part of the summary, memory, retrieval and
curation suites alone; `chat-loop-full` is the chat loop's full
profile (200 turns at one turn a second; the default runs its quick profile).
"""

from __future__ import annotations

import asyncio
import os
import platform
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from bench import (
    agent,
    chat_loop,
    curation,
    embedding,
    forks,
    hostile,
    memory,
    memory_watch,
    retrieval,
    summary,
    transcript,
    watch,
)
from bench.common import postgres

SUITES: dict[str, Callable[[str], Coroutine[Any, Any, list[str]]]] = {
    "transcript": transcript.run,
    "forks": forks.run,
    "summary": summary.run,
    "memory": memory.run,
    "agent": agent.run,
    "chat-loop": chat_loop.run,
    "embedding": embedding.run,
    "watch": watch.run,
    "memory-watch": memory_watch.run,
    "retrieval": retrieval.run,
    "hostile": hostile.run,
    "curation": curation.run,
    # Parts of the suites above, to run alone.
    "digests": forks.digests_only,
    "summary-claim": summary.claim_cost,
    "memory-indexing": memory.indexing,
    "memory-validity": memory.validity,
    "retrieval-quality": retrieval.quality,
    "retrieval-latency": retrieval.latency,
    "curation-quality": curation.quality,
    "curation-throughput": curation.throughput,
    "curation-claim": curation.claim_cost,
    "curation-latency": curation.latency,
    "chat-loop-full": chat_loop.full,
}
DEFAULT = [
    "transcript",
    "forks",
    "summary",
    "memory",
    "agent",
    "chat-loop",
    "embedding",
    "watch",
    "memory-watch",
    "retrieval",
    "hostile",
    "curation",
]


def main() -> None:
    chosen = sys.argv[1:] or DEFAULT
    print(
        f"# Runifold benchmarks on {platform.node()} ({platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()})\n"
    )
    with postgres() as url:
        for name in chosen:
            for line in asyncio.run(SUITES[name](url)):
                print(line, flush=True)
            print()


if __name__ == "__main__":
    main()
