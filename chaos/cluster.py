"""The split deployment the campaign runs against, on loopback.

PostgreSQL (one server, or a primary with a synchronous standby), a TCP proxy in front
of it and in front of every service that another service calls, and the services as
their own processes (`python -m services.<name>`), each on a fixed port so that a
killed one comes back where its callers look for it:

    transcript-1, transcript-2      two replicas on one database
    memory-1, memory-2              two replicas, the pgvector index (shared), embeddings
                                    from the fake model's endpoint
    summary                         with its background workers
    agent-1, agent-2                agent-1 calls transcript-1 and memory-1, agent-2 the
                                    others, both summary; the model is the fake one

Every call a service makes to PostgreSQL or to another service goes through a proxy,
so the nemesis can delay, partition or reset it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from chaos.proxy import Proxy

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def pgctl(*args: str) -> str:
    """chaos.pgctl in a process of its own (it switches users: no gRPC threads there)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "chaos.pgctl",
        *args,
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=180)
    if process.returncode != 0:
        raise RuntimeError(f"pgctl {' '.join(args)} failed:\n{err.decode()[-3000:]}")
    return out.decode()


@dataclass
class Postgres:
    """One PostgreSQL server of the campaign (its folder, its port)."""

    folder: Path
    port: int
    running: bool = True

    async def stop(self, mode: str = "fast") -> None:
        await pgctl("stop", str(self.folder), mode)
        self.running = False

    async def kill(self) -> None:
        await pgctl("kill", str(self.folder))
        self.running = False

    async def start(self) -> None:
        await pgctl("start", str(self.folder))
        self.running = True


@dataclass
class Service:
    """A service process on a fixed port."""

    name: str
    module: str
    port: int
    env: dict[str, str]
    log: Path
    process: asyncio.subprocess.Process | None = None
    paused: bool = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self, timeout: float = 90.0) -> None:
        environment = {
            **os.environ,
            "RUNIFOLD_LISTEN": self.address,
            "RUNIFOLD_METRICS_LISTEN": "off",
            "RUNIFOLD_HTTP_LISTEN": "off",
            "RUNIFOLD_LOG_LEVEL": "WARNING",
            "RUNIFOLD_PAGE_TOKEN_SECRET": "chaos-secret-0123456789",
            **self.env,
        }
        with self.log.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                self.module,
                cwd=ROOT,
                env=environment,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        self.paused = False
        await self.until_serving(timeout)

    async def until_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        async with grpc.aio.insecure_channel(self.address) as channel:
            health: Any = health_pb2_grpc.HealthStub(channel)  # published types lack methods
            while True:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                assert self.process is not None
                if self.process.returncode is not None:
                    raise RuntimeError(f"{self.name} exited: see {self.log}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not serve within {timeout:g} s")
                await asyncio.sleep(0.2)  # start-up poll

    def signal(self, sig: signal.Signals) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(sig)
            if sig == signal.SIGSTOP:
                self.paused = True
            elif sig == signal.SIGCONT:
                self.paused = False

    async def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.process is not None:
            await self.process.wait()

    async def stop(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        if self.paused:
            self.signal(signal.SIGCONT)
        self.process.terminate()
        try:
            await asyncio.wait_for(self.process.wait(), 30)
        except TimeoutError:
            await self.kill()


@dataclass
class Cluster:
    folder: Path
    model_url: str
    failover: bool = False
    primary: Postgres | None = None
    standby: Postgres | None = None
    db_proxies: list[Proxy] = field(default_factory=list)
    proxies: dict[str, Proxy] = field(default_factory=dict)
    services: dict[str, Service] = field(default_factory=dict)

    @property
    def database_url(self) -> str:
        """What the services connect to: through the proxies, every server (the
        writable one is found by target_session_attrs when there are two)."""
        hosts = ",".join("127.0.0.1" for _ in self.db_proxies)
        ports = ",".join(str(p.port) for p in self.db_proxies)
        return (
            f"host={hosts} port={ports} user=postgres dbname=postgres "
            "target_session_attrs=read-write connect_timeout=2"
        )

    @property
    def direct_url(self) -> str:
        """The writable server, directly (for the final reads)."""
        server = self.primary if self.primary is not None and self.primary.running else self.standby
        assert server is not None
        return f"host=127.0.0.1 port={server.port} user=postgres dbname=postgres"

    async def start(self) -> None:
        self.primary = Postgres(self.folder / "pg-primary", free_port())
        await pgctl("init", str(self.primary.folder), str(self.primary.port))
        servers = [self.primary]
        if self.failover:
            self.standby = Postgres(self.folder / "pg-standby", free_port())
            await pgctl(
                "standby", str(self.primary.port), str(self.standby.folder), str(self.standby.port)
            )
            await pgctl("sync", str(self.primary.port))
            servers.append(self.standby)
        for server in servers:
            proxy = Proxy(server.port, name=f"postgres:{server.folder.name}")
            await proxy.start()
            self.db_proxies.append(proxy)
        ports = {name: free_port() for name in SERVICES}
        for name in SERVICES:
            proxy = Proxy(ports[name], name=name)
            await proxy.start()
            self.proxies[name] = proxy
        via = {name: f"127.0.0.1:{proxy.port}" for name, proxy in self.proxies.items()}
        common = {"DATABASE_URL": self.database_url, "RUNIFOLD_DB_TIMEOUT_S": "3"}
        envs = {
            "transcript-1": {},
            "transcript-2": {},
            "memory-1": {
                **_memory_env(self.model_url),
                "TRANSCRIPT_SERVICE_ADDR": via["transcript-1"],
            },
            "memory-2": {
                **_memory_env(self.model_url),
                "TRANSCRIPT_SERVICE_ADDR": via["transcript-2"],
            },
            "summary": {"TRANSCRIPT_SERVICE_ADDR": via["transcript-1"]},
            "agent-1": _agent_env(
                self.model_url, via["transcript-1"], via["summary"], via["memory-1"]
            ),
            "agent-2": _agent_env(
                self.model_url, via["transcript-2"], via["summary"], via["memory-2"]
            ),
        }
        for name in SERVICES:
            self.services[name] = Service(
                name,
                SERVICES[name],
                ports[name],
                {**common, **envs[name], "RUNIFOLD_DATA_DIR": str(self.folder / name)},
                self.folder / f"{name}.log",
            )
        # The first start applies the migrations (under their advisory lock); then the rest.
        await self.services["transcript-1"].start()
        await asyncio.gather(*(s.start() for n, s in self.services.items() if n != "transcript-1"))

    async def close(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.services.values()), return_exceptions=True)
        for proxy in [*self.proxies.values(), *self.db_proxies]:
            await proxy.close()
        for server in (self.primary, self.standby):
            if server is not None and server.running:
                with contextlib.suppress(RuntimeError):
                    await server.stop("immediate")

    def address(self, name: str) -> str:
        return self.services[name].address


SERVICES = {
    "transcript-1": "services.transcript",
    "transcript-2": "services.transcript",
    "memory-1": "services.memory",
    "memory-2": "services.memory",
    "summary": "services.summary",
    "agent-1": "services.agent",
    "agent-2": "services.agent",
}


def _memory_env(model_url: str) -> dict[str, str]:
    return {
        "RUNIFOLD_MEMORY_INDEX": "pgvector",
        "RUNIFOLD_EMBEDDINGS": "openai",
        "RUNIFOLD_EMBEDDINGS_URL": model_url,
        "RUNIFOLD_EMBEDDINGS_MODEL": "fake-embedding",
        "RUNIFOLD_EMBEDDINGS_DIMENSION": "8",
        "RUNIFOLD_MEMORY_INDEXER_CLAIM_S": "5",
    }


def _agent_env(model_url: str, transcript: str, summary: str, memory: str) -> dict[str, str]:
    return {
        "TRANSCRIPT_SERVICE_ADDR": transcript,
        "SUMMARY_SERVICE_ADDR": summary,
        "MEMORY_SERVICE_ADDR": memory,
        "RUNIFOLD_AGENT_MODEL_PROVIDER": "openai",
        "RUNIFOLD_OPENAI_BASE_URL": model_url,
        "RUNIFOLD_AGENT_MODEL": "fake-model",
        "RUNIFOLD_AGENT_MODEL_MAX_RETRIES": "0",
        # A killed agent's lease lapses soon, so the campaign's turns move on.
        "RUNIFOLD_AGENT_TURN_LEASE_TTL_S": "4",
    }


def temporary_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="runifold-chaos-"))
    folder.chmod(0o755)  # PostgreSQL runs as another user under it
    return folder
