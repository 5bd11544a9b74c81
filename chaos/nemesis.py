"""The nemesis: faults on a schedule, each recorded in the history, each healed before
the next.

Kinds: `kill` (SIGKILL of a service process, which comes back a moment later), `pause`
(SIGSTOP, then SIGCONT), `postgres-restart` (PostgreSQL stopped, fast or as a crash, then
started), `failover` (the primary killed and the synchronous standby promoted: once, in a
campaign with a standby), `delay`, `partition` and `reset` on a proxy (between services,
or in front of PostgreSQL). The first faults go through every kind once, in a random
order, so that even a short campaign injects each.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time

from chaos.cluster import Cluster
from chaos.history import History

KINDS = ("kill", "pause", "postgres-restart", "delay", "partition", "reset")


class Nemesis:
    def __init__(self, cluster: Cluster, history: History, seed: int, interval_s: float) -> None:
        self.cluster = cluster
        self.history = history
        self.rng = random.Random(seed)
        self.interval_s = interval_s
        self.stop = asyncio.Event()
        # When the primary died (failover), for the recovery time.
        self.failover_at: float | None = None

    def schedule(self) -> list[str]:
        kinds = list(KINDS)
        if self.cluster.failover:
            kinds.append("failover")
        self.rng.shuffle(kinds)
        return kinds

    async def run(self) -> None:
        first = self.schedule()
        while not self.stop.is_set():
            try:
                await asyncio.wait_for(
                    self.stop.wait(), self.interval_s * self.rng.uniform(0.5, 1.5)
                )
                break
            except TimeoutError:
                pass
            kind = first.pop() if first else self.rng.choice(KINDS)
            await self.inject(kind)

    async def inject(self, kind: str) -> None:
        cluster, rng = self.cluster, self.rng
        if kind in ("kill", "pause"):
            name = rng.choice(sorted(cluster.services))
            service = cluster.services[name]
            fault = self.history.fault(kind, name)
            if kind == "kill":
                await service.kill()
                await asyncio.sleep(rng.uniform(0.5, 2.0))  # down for a while
                await service.start()
            else:
                service.signal(signal.SIGSTOP)
                await asyncio.sleep(rng.uniform(1.0, 4.0))  # paused for a while
                service.signal(signal.SIGCONT)
            fault.end = time.monotonic()
        elif kind == "postgres-restart":
            server = (
                cluster.primary if cluster.primary and cluster.primary.running else cluster.standby
            )
            assert server is not None
            mode = rng.choice(["fast", "immediate"])
            fault = self.history.fault(kind, f"{server.folder.name} ({mode})")
            await server.stop(mode)
            await asyncio.sleep(rng.uniform(1.0, 3.0))  # down for a while
            await server.start()
            fault.end = time.monotonic()
        elif kind == "failover":
            assert cluster.primary is not None and cluster.standby is not None
            fault = self.history.fault(kind, cluster.primary.folder.name)
            await cluster.primary.kill()
            self.failover_at = time.monotonic()  # the primary is gone from here on
            from chaos.cluster import pgctl

            await pgctl("promote", str(cluster.standby.folder), str(cluster.standby.port))
            fault.end = time.monotonic()
        else:
            proxies = [*cluster.proxies.values(), *cluster.db_proxies]
            proxy = rng.choice(proxies)
            fault = self.history.fault(kind, proxy.name)
            if kind == "reset":
                proxy.reset()
            else:
                if kind == "delay":
                    proxy.delay(rng.uniform(0.05, 0.4))
                else:
                    proxy.drop()
                await asyncio.sleep(rng.uniform(1.0, 4.0))  # the fault lasts
                proxy.heal()
            fault.end = time.monotonic()

    async def heal_all(self) -> None:
        """Everything back: proxies healed, processes continued or started again,
        PostgreSQL running."""
        for proxy in [*self.cluster.proxies.values(), *self.cluster.db_proxies]:
            proxy.heal()
        for server in (self.cluster.primary, self.cluster.standby):
            if server is not None and not server.running and server is not self.cluster.primary:
                await server.start()
        primary = self.cluster.primary
        if primary is not None and not primary.running and self.failover_at is None:
            await primary.start()
        for service in self.cluster.services.values():
            if service.paused:
                service.signal(signal.SIGCONT)
            if service.process is None or service.process.returncode is not None:
                await service.start()
