"""Shared benchmark plumbing: a real PostgreSQL, servers in their own processes, stats."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

import grpc
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from services.common import stubs


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
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies) * 1000

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
    import pgserver

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
async def server_process(
    module: str, database_url: str, env: dict[str, str] | None = None
) -> AsyncIterator[str]:
    """Run `python -m <module>` as its own process; yield its address once SERVING."""
    port = free_port()
    environment = {
        **os.environ,
        "DATABASE_URL": database_url,
        "RUNIFOLD_LISTEN": f"127.0.0.1:{port}",
        "RUNIFOLD_METRICS_LISTEN": "off",
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
            from grpc_health.v1 import health_pb2

            deadline = time.monotonic() + 60
            while True:
                try:
                    reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.aio.AioRpcError:
                    pass
                if process.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{module} did not start")
                await asyncio.sleep(0.2)
        yield address
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), timeout=30)
