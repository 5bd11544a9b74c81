"""Measure one peer system, in `.venv-peers`: `python -m bench.peers.runner KIND SYSTEM URL`.

KIND is `conversations` (SYSTEM: raw, langgraph, adk) or `search` (SYSTEM:
langgraph). Progress goes to stderr; the result is one JSON object on stdout.
`make bench-peers` runs this for each peer (bench/peers/__main__.py).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from bench.peers import systems
from bench.peers.workload import (
    SIZES,
    exact_answers,
    load_model,
    run_conversations,
    run_search,
)


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def _conversations(system: str, url: str, sizes: tuple[int, ...]) -> dict[str, Any]:
    classes: dict[str, Any] = {
        "raw": systems.RawConversations,
        "langgraph": systems.LangGraphConversations,
        "adk": systems.AdkConversations,
    }
    target = classes[system](url)
    await target.open()
    try:
        return await run_conversations(target, sizes, _log)
    finally:
        await target.close()


async def _search(url: str) -> dict[str, Any]:
    exact = exact_answers(load_model(threads=1))
    target = systems.LangGraphSearch(url)
    await target.open()
    try:
        return await run_search(target, exact, _log)
    finally:
        await target.close()


def main(argv: list[str]) -> None:
    kind, system, url = argv[:3]
    sizes = tuple(int(s) for s in argv[3].split(",")) if len(argv) > 3 else SIZES
    if kind == "conversations":
        result = asyncio.run(_conversations(system, url, sizes))
    elif kind == "search" and system == "langgraph":
        result = asyncio.run(_search(url))
    else:
        raise SystemExit(f"unknown measurement {kind} {system}")
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
