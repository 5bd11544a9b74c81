"""Process entry: settings, logs, the database, metrics, the server, signals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from prometheus_client import start_http_server

from services.common import allocator, logs, tracing
from services.common.auth import AuthSettings, check_exposure
from services.common.http.settings import HttpSettings
from services.common.listen import ListenError, bind_cause, check_listen
from services.common.postgres.embedded import start_embedded_postgres
from services.common.server import Component, serve_until_signal, start_server
from services.common.settings import Settings, SettingsError

log = logging.getLogger(__name__)


async def _run(
    label: str,
    components: Sequence[Component],
    settings: Settings,
    auth: AuthSettings,
    all_in_one: bool,
    http: HttpSettings,
) -> None:
    # The addresses first: a taken port fails in one line before anything starts.
    check_listen(settings.listen_address, "RUNIFOLD_LISTEN")
    if http.listen_address is not None:
        check_listen(http.listen_address, "RUNIFOLD_HTTP_LISTEN")
    metrics_address = settings.metrics_address
    if metrics_address is not None:
        host, _, port = metrics_address.rpartition(":")
        try:
            httpd, _ = start_http_server(int(port), addr=host.strip("[]"))
        except OSError as exc:
            raise ListenError(metrics_address, "RUNIFOLD_METRICS_LISTEN", bind_cause(exc)) from None
        # The bound port (RUNIFOLD_METRICS_LISTEN may ask for port 0).
        metrics_address = f"{host}:{httpd.server_port}"
    database_url = settings.database_url
    needs_database = any(getattr(c, "needs_database", True) for c in components)
    if database_url is None and needs_database:
        database_url = start_embedded_postgres(settings.data_dir / "postgres")
        print(
            f"runifold: embedded PostgreSQL (pgserver) with data in "
            f"{settings.data_dir / 'postgres'}",
            file=sys.stderr,
        )
    running = await start_server(
        components,
        settings,
        database_url=database_url,
        extras={"all_in_one": all_in_one},
        auth=auth,
        http=http,
    )
    services = ", ".join(name for c in running.components for name in c.service_names)
    if running.http is not None:
        # Its own line, before the one that says the server is serving.
        url = running.http.url
        print(
            f"runifold {label}: console on {url}/; HTTP JSON, Connect and gRPC-Web on the same port"
            if http.console
            else f"runifold {label}: HTTP JSON, Connect and gRPC-Web on {url}",
            file=sys.stderr,
            flush=True,
        )
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
    """Run a server process hosting the given components until SIGTERM/SIGINT.

    A configuration mistake (a bad or missing variable, an unauthenticated
    listener on a non-loopback address, an address already in use) stops the
    process with exit code 2 and a one-line message that names the variable.
    """
    # Before anything allocates: large buffers go back to the system once freed.
    allocator.give_back_freed_memory()
    try:
        settings = Settings.from_env()
        auth = AuthSettings.from_env()
        http = HttpSettings.from_env(all_in_one=all_in_one)
        warning = check_exposure(auth, settings.listen_address)
        if http.listen_address is not None:
            # The HTTP port answers the same calls: the same refusal, the same warning.
            warning = check_exposure(auth, http.listen_address) or warning
        logs.configure(label, settings.log_level, settings.log_format)
        tracing.configure(label, os.environ)
        components = make_components()
    except (SettingsError, ValueError) as exc:
        configuration_error(exc)
    if warning:
        print(f"runifold: {warning}", file=sys.stderr)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_run(label, components, settings, auth, all_in_one, http))
    except SettingsError as exc:
        configuration_error(exc)
    except ListenError as exc:
        print(f"runifold: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    finally:
        tracing.shutdown()  # flush the spans still batched


def configuration_error(exc: Exception) -> NoReturn:
    """Say what is wrong with the configuration and exit with status 2."""
    print(f"runifold: configuration error: {exc}", file=sys.stderr)
    raise SystemExit(2) from None
