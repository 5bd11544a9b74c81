"""Process entry: settings, logs, the database, metrics, the server, signals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Sequence

from prometheus_client import start_http_server

from services.common import logs, tracing
from services.common.db import start_embedded_postgres
from services.common.server import Component, serve_until_signal, start_server
from services.common.settings import Settings, SettingsError

log = logging.getLogger(__name__)


def _is_loopback(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]")
    return host in {"127.0.0.1", "localhost", "::1"}


async def _run(
    label: str,
    make_components: Callable[[], Sequence[Component]],
    settings: Settings,
    all_in_one: bool,
) -> None:
    database_url = settings.database_url
    if database_url is None:
        database_url = start_embedded_postgres(settings.data_dir / "postgres")
        print(
            f"runifold: embedded PostgreSQL (pgserver) with data in "
            f"{settings.data_dir / 'postgres'}",
            file=sys.stderr,
        )
    metrics_address = settings.metrics_address
    if metrics_address is not None:
        host, _, port = metrics_address.rpartition(":")
        httpd, _ = start_http_server(int(port), addr=host.strip("[]"))
        # The bound port (RUNIFOLD_METRICS_LISTEN may ask for port 0).
        metrics_address = f"{host}:{httpd.server_port}"
    running = await start_server(
        make_components(), settings, database_url=database_url, extras={"all_in_one": all_in_one}
    )
    services = ", ".join(name for c in running.components for name in c.service_names)
    print(
        f"runifold {label}: serving {services} on {running.address}"
        + (f"; metrics on http://{metrics_address}/metrics" if metrics_address else ""),
        file=sys.stderr,
        flush=True,
    )
    await serve_until_signal(running)


def main(
    label: str, make_components: Callable[[], Sequence[Component]], *, all_in_one: bool = False
) -> None:
    """Run a server process hosting the given components until SIGTERM/SIGINT."""
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        print(f"runifold: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    logs.configure(label, settings.log_level, settings.log_format)
    try:
        tracing.configure(label, os.environ)
    except ValueError as exc:
        print(f"runifold: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if os.environ.get("RUNIFOLD_UVLOOP") == "1":
        import uvloop

        uvloop.install()
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_run(label, make_components, settings, all_in_one))
    finally:
        tracing.shutdown()  # flush the spans still batched
