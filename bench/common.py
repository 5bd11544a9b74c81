"""Shared benchmark plumbing: a real PostgreSQL, servers in their own processes, stats.

The standard-library-only helpers (percentiles, RSS) are in bench/stats.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import psycopg
from grpc_health.v1 import health_pb2
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from bench.stats import median_ms, percentile_ms
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client.policy import user
from services.common import stubs

if TYPE_CHECKING:
    from runifold.transcript.v1.transcript_service_pb2_grpc import TranscriptServiceAsyncStub


@dataclass
class Stats:
    """Latencies (seconds) of one measured run."""

    name: str
    latencies: list[float]
    elapsed: float

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0

    def pct(self, q: float) -> float:
        return percentile_ms(self.latencies, q)

    @property
    def p50(self) -> float:
        return median_ms(self.latencies)

    def row(self) -> str:
        return (
            f"{self.name:<46} {self.rate:>10.0f}/s  p50 {self.p50:>7.2f} ms"
            f"  p99 {self.pct(0.99):>7.2f} ms  n={len(self.latencies)}"
        )


def median_round(runs: list[Stats]) -> Stats:
    """The run with the median rate."""
    return sorted(runs, key=lambda run: run.rate)[len(runs) // 2]


async def measure(
    name: str,
    concurrency: int,
    total: int,
    op: Callable[[int, int], Awaitable[None]],
    warmup: int = 50,
) -> Stats:
    """Run `total` operations with `concurrency` in flight; op(worker, i)."""
    for i in range(min(warmup, total)):
        await op(0, -1 - i)
    latencies: list[float] = []
    per_worker = total // concurrency

    async def worker(w: int) -> None:
        for i in range(per_worker):
            start = time.perf_counter()
            await op(w, i)
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return Stats(name, latencies, time.perf_counter() - start)


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """DATABASE_URL, or a pgserver PostgreSQL in a temporary folder."""
    if os.environ.get("DATABASE_URL"):
        yield os.environ["DATABASE_URL"]
        return
    from services.common.postgres.embedded import import_pgserver

    pgserver = import_pgserver()
    with tempfile.TemporaryDirectory(prefix="runifold-bench-") as folder:
        server = pgserver.get_server(folder, cleanup_mode="stop")
        try:
            yield server.get_uri()
        finally:
            server.cleanup()


def new_database(url: str) -> str:
    """A fresh database on the same server."""
    name = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    params = conninfo_to_dict(url)
    params["dbname"] = name
    return make_conninfo("", **params)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def server(
    module: str,
    database_url: str,
    env: dict[str, str] | None = None,
    *,
    start_timeout: float = 60.0,
) -> AsyncIterator[tuple[str, int]]:
    """Run `python -m <module>` as its own process; yield (address, pid) once SERVING.

    `env` adds to (or overrides) the process's environment: DATABASE_URL, a free
    port, no metrics listener, log level WARNING.
    """
    port = free_port()
    environment = {
        **os.environ,
        "DATABASE_URL": database_url,
        "RUNIFOLD_LISTEN": f"127.0.0.1:{port}",
        "RUNIFOLD_METRICS_LISTEN": "off",
        "RUNIFOLD_HTTP_LISTEN": "off",
        "RUNIFOLD_LOG_LEVEL": "WARNING",
        **(env or {}),
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, env=environment, stdout=subprocess.DEVNULL
    )
    address = f"127.0.0.1:{port}"
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            health = stubs.health(channel)
            deadline = time.monotonic() + start_timeout
            while True:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        break
                if process.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{module} did not start")
                await asyncio.sleep(0.2)  # start-up poll
        yield address, process.pid
    finally:
        if process.returncode is None:
            process.terminate()
            await asyncio.wait_for(process.wait(), timeout=60)


@contextlib.asynccontextmanager
async def server_process(
    module: str, database_url: str, env: dict[str, str] | None = None
) -> AsyncIterator[str]:
    """Run `python -m <module>` as its own process; yield its address once SERVING."""
    async with server(module, database_url, env) as (address, _):
        yield address


async def seed_conversation(
    transcript: TranscriptServiceAsyncStub, namespace: str, texts: Sequence[str]
) -> str:
    """A new conversation holding `texts` as user messages (sequences 1..n); its id."""
    created = await transcript.CreateConversation(
        transcript_pb.CreateConversationRequest(namespace=namespace)
    )
    conversation_id = created.conversation.conversation_id
    await transcript.AppendEntries(
        transcript_pb.AppendEntriesRequest(
            namespace=namespace,
            conversation_id=conversation_id,
            messages=[user(text) for text in texts],
        )
    )
    return conversation_id


async def outbox_drained(conn: psycopg.AsyncConnection[Any], interval: float) -> None:
    """Return once memory.outbox is empty: the indexer has embedded and indexed every write."""
    while True:
        cursor = await conn.execute("SELECT count(*) FROM memory.outbox")
        row = await cursor.fetchone()
        if row is not None and row[0] == 0:
            return
        await asyncio.sleep(interval)  # the indexer's progress poll
