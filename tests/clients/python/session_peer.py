"""A second writer in a process of its own: one RunifoldSession call against a server,
its result printed as JSON on stdout. Tests run it to race a session object of theirs
across the process boundary (see test_openai_agents.py).

    python -m tests.clients.python.session_peer TARGET NAMESPACE SESSION_ID pop
    python -m tests.clients.python.session_peer TARGET NAMESPACE SESSION_ID add ITEMS_JSON

`add` reads the session first (get_items), then adds the items, as a run would.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from runifold_client.openai_agents import RunifoldSession

ROOT = Path(__file__).resolve().parents[3]


async def call(target: str, namespace: str, session_id: str, op: str, *rest: str) -> Any:
    session = RunifoldSession(session_id, target=target, namespace=namespace)
    try:
        if op == "pop":
            return await session.pop_item()
        if op == "add":
            await session.get_items()
            await session.add_items(json.loads(rest[0]))
            return None
        raise SystemExit(f"unknown operation {op!r}")
    finally:
        await session.close()


async def run_peer(target: str, namespace: str, session_id: str, op: str, *rest: str) -> Any:
    """Run the peer as its own process and return what it printed (parsed)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.clients.python.session_peer",
        target,
        namespace,
        session_id,
        op,
        *rest,
        cwd=ROOT,
        env=dict(os.environ),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return json.loads(out)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(call(*sys.argv[1:]))))
