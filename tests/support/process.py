"""A service started as production starts it: `python -m services.<name>`, its own process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.tools import ROOT

_BANNER = re.compile(
    r"serving (?P<services>.*?) on (?P<address>[^\s;]+)(?:; metrics on (?P<url>\S+))?$"
)
# The HTTP port's line, printed before the banner: "console on URL/; ..." or "... on URL".
_HTTP_BANNER = re.compile(r"(?:console on (?P<console>\S+?)/;|gRPC-Web on (?P<http>\S+)$)")


@dataclass
class ServiceProcess:
    """A running service process: its gRPC address and its metrics URL."""

    process: asyncio.subprocess.Process
    address: str
    metrics_url: str
    output: list[str] = field(default_factory=list)
    # The HTTP port's base URL (RUNIFOLD_HTTP_LISTEN), when it serves one.
    http_url: str | None = None

    async def scrape(self) -> str:
        """The text exposition of /metrics, fetched over HTTP."""
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.get(self.metrics_url)
        response.raise_for_status()
        assert response.headers["content-type"].startswith("text/plain")
        return response.text


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition, keyed by name and labels."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples(text).items() if n == name and wanted <= ls)


@contextlib.asynccontextmanager
async def service_process(
    module: str, env: Mapping[str, str], data_dir: Path, timeout: float = 60.0
) -> AsyncIterator[ServiceProcess]:
    """Start `python -m <module>` on ephemeral ports; stop it with SIGTERM (graceful)."""
    full_env = {
        **os.environ,
        "RUNIFOLD_LISTEN": "127.0.0.1:0",
        "RUNIFOLD_METRICS_LISTEN": "127.0.0.1:0",
        # The all-in-one server's HTTP port, never its default 8080 (a developer's `make
        # run` may hold it); a service alone serves none unless `env` asks.
        "RUNIFOLD_HTTP_LISTEN": "127.0.0.1:0" if module == "services" else "off",
        "RUNIFOLD_DATA_DIR": str(data_dir),
        "RUNIFOLD_LOG_LEVEL": "WARNING",
        "RUNIFOLD_PAGE_TOKEN_SECRET": "test-secret-0123456789",
        "RUNIFOLD_HEALTH_INTERVAL_S": "0.2",
        **env,
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        cwd=ROOT,
        env=full_env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    output: list[str] = []
    http_url: str | None = None
    try:
        async with asyncio.timeout(timeout):
            while True:
                line = (await process.stderr.readline()).decode()
                if not line:
                    raise AssertionError(f"{module} exited before serving:\n{''.join(output)}")
                output.append(line)
                if line.startswith("runifold") and (http := _HTTP_BANNER.search(line.strip())):
                    http_url = http["console"] or http["http"]
                match = _BANNER.search(line.strip())
                if match and match["url"]:
                    break
    except BaseException as exc:
        if process.returncode is None:  # it may have exited already (and said why)
            process.kill()
        await process.wait()
        if isinstance(exc, TimeoutError):
            raise AssertionError(f"{module} did not serve in time:\n{''.join(output)}") from None
        raise

    async def drain() -> None:  # keep the pipe from filling up
        assert process.stderr is not None
        async for raw in process.stderr:
            output.append(raw.decode())

    drainer = asyncio.create_task(drain())
    running = ServiceProcess(process, match["address"], match["url"], output, http_url)
    try:
        yield running
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(30):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
        await drainer
