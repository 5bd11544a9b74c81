"""The gRPC server bootstrap shared by every service and the all-in-one mode.

A process hosts one or more `Component`s (a service each). The bootstrap
binds the port, starts the components (pools, migrations, clients), serves
health (grpcio-health-checking) and reflection (grpcio-reflection), keeps the
health status in step with each component, and shuts down gracefully: health
goes NOT_SERVING, in-flight RPCs finish within the grace period, then the
components close their pools.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, cast

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.common import metrics
from services.common.admission import Admission
from services.common.auth import (
    AuthGate,
    AuthSettings,
    InternalCredential,
    make_authenticator,
    server_credentials,
)
from services.common.background import cancel_and_wait
from services.common.interceptors import ServiceInterceptor
from services.common.listen import ListenError, check_listen
from services.common.settings import Settings, SettingsError, TransportLimits

if TYPE_CHECKING:
    from services.common.http.port import HttpPort
    from services.common.http.settings import HttpSettings

log = logging.getLogger(__name__)

# A health entry that is SERVING for as long as the process runs (until shutdown):
# the liveness probe's, so that a database outage (readiness) never restarts pods.
LIVENESS = "runifold.liveness"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class StartContext:
    """What components learn when the process starts."""

    settings: Settings
    self_address: str
    database_url: str | None
    extras: dict[str, object] = field(default_factory=dict)
    auth: AuthSettings = field(default_factory=AuthSettings)

    def peer_address(self, service: str) -> str:
        """Where a peer service is: `<SERVICE>_SERVICE_ADDR`, or this very server
        when it hosts every service (all-in-one)."""
        configured = getattr(self.settings, f"{service}_service_addr", None)
        if configured:
            return str(configured)
        if self.extras.get("all_in_one"):
            return self.self_address
        raise SettingsError(
            f"{service.upper()}_SERVICE_ADDR must be set to reach the {service} service"
        )


class Component(Protocol):
    """One service hosted by a server process."""

    @property
    def name(self) -> str:
        """Short name used in logs ("transcript")."""

    @property
    def service_names(self) -> Sequence[str]:
        """Fully qualified gRPC service names it serves."""

    def register(self, server: grpc.aio.Server) -> None:
        """Add the servicer(s) to the server (after start, before serving)."""

    async def start(self, ctx: StartContext) -> None:
        """Open pools, apply or check migrations, create clients."""

    async def stop(self) -> None:
        """Release everything start acquired (idempotent)."""

    async def healthy(self) -> bool:
        """True when the component can serve (store reachable, schema current)."""

    # Optional: `max_request_bytes`, the size of the largest request its limits allow
    # (read with getattr; a component without it asks for no more than the floor), and
    # `async drain(timeout_s)`, called at shutdown once health is NOT_SERVING and before
    # the calls in flight get their grace period: ends the streams that would never end
    # by themselves.


# The smallest transport cap: every small request (memories, summaries, leases) fits.
MIN_RECEIVE_MESSAGE_BYTES = 1024 * 1024
_CAP_GRANULE = 64 * 1024


def receive_cap(components: Sequence[Component], transport: TransportLimits) -> int:
    """`grpc.max_receive_message_length`: RUNIFOLD_MAX_RECEIVE_MESSAGE_BYTES when set,
    else just above the largest request the hosted services allow (rounded up to
    64 KiB), so that grpc refuses anything larger before reading it into memory."""
    if transport.max_receive_message_bytes is not None:
        return transport.max_receive_message_bytes
    largest = max(
        [MIN_RECEIVE_MESSAGE_BYTES, *(getattr(c, "max_request_bytes", 0) for c in components)]
    )
    return -(-largest // _CAP_GRANULE) * _CAP_GRANULE


def server_options(cap: int, transport: TransportLimits) -> list[tuple[str, int]]:
    """The grpc core options of the listener: message sizes, connection limits and
    keepalive (docs/production.md, "Limits")."""

    def ms(seconds: float) -> int:
        return max(1, round(seconds * 1000))

    # grpc takes INT_MAX as "no limit" for the connection ages.
    never = 2**31 - 1
    options = [
        ("grpc.max_receive_message_length", cap),
        ("grpc.max_send_message_length", transport.max_send_message_bytes),
        ("grpc.so_reuseport", 0),
        # No bandwidth-delay probing: it grows each stream's receive window to megabytes,
        # so that a caller can park that much per call in the transport before any of our
        # code refuses it (as on main: tests/system/security/test_preauth_reading.py).
        ("grpc.http2.bdp_probe", 0),
        # A connection must finish its handshake (TLS, and the client's HTTP/2
        # SETTINGS) within this time, or it is closed: a socket that never speaks
        # costs a file descriptor for seconds, not for ever.
        ("grpc.server_handshake_timeout_ms", ms(transport.handshake_timeout_s)),
        (
            "grpc.max_connection_idle_ms",
            ms(transport.max_connection_idle_s) if transport.max_connection_idle_s else never,
        ),
        (
            "grpc.max_connection_age_ms",
            ms(transport.max_connection_age_s) if transport.max_connection_age_s else never,
        ),
        (
            "grpc.max_connection_age_grace_ms",
            ms(transport.max_connection_age_grace_s)
            if transport.max_connection_age_grace_s
            else never,
        ),
        ("grpc.keepalive_time_ms", ms(transport.keepalive_time_s)),
        ("grpc.keepalive_timeout_ms", ms(transport.keepalive_timeout_s)),
        # Clients (the services' own peer channels ping every 30 s) may ping this often.
        (
            "grpc.http2.min_ping_interval_without_data_ms",
            ms(transport.min_client_ping_interval_s),
        ),
    ]
    if transport.max_connections:
        # Enforced per listener before the handshake: a connection beyond it is closed.
        options.append(("grpc.max_allowed_incoming_connections", transport.max_connections))
    return options


@dataclass
class RunningServer:
    """A started server and the handles tests and operators need."""

    server: grpc.aio.Server
    address: str
    port: int
    health: health.aio.HealthServicer
    components: Sequence[Component]
    settings: Settings
    # The HTTP port (RUNIFOLD_HTTP_LISTEN), when the process serves one.
    http: HttpPort | None = None
    _health_task: asyncio.Task[None] | None = None
    _stopped: bool = False

    async def stop(self, grace: float | None = None) -> None:
        """Graceful shutdown: NOT_SERVING, drain in-flight RPCs (on both listeners),
        close components."""
        if self._stopped:
            return
        self._stopped = True
        await self.health.enter_graceful_shutdown()
        await cancel_and_wait(self._health_task)
        grace = self.settings.shutdown_grace_s if grace is None else grace
        # Streams that never end by themselves (WatchConversation) are ended first, with
        # a status their clients resume from on another replica; then the calls in flight
        # get the grace period to finish.
        drains = [getattr(c, "drain", None) for c in self.components]
        await asyncio.gather(*(drain(grace / 2) for drain in drains if drain is not None))
        if self.http is not None:
            await asyncio.gather(self.server.stop(grace), self.http.stop(grace))
        else:
            await self.server.stop(grace)
        for component in reversed(self.components):
            try:
                await component.stop()
            except Exception:
                log.exception("component stop failed", extra={"component": component.name})
        log.info("server stopped", extra={"address": self.address})


async def _refresh_health(running: RunningServer) -> None:
    statuses = []
    for component in running.components:
        try:
            ok = await asyncio.wait_for(
                component.healthy(), timeout=max(running.settings.health_interval_s, 1.0)
            )
        except Exception:
            ok = False
        statuses.append(ok)
        metrics.SERVICE_SERVING.labels(component.name).set(1 if ok else 0)
        for name in component.service_names:
            await running.health.set(name, SERVING if ok else NOT_SERVING)
    await running.health.set("", SERVING if all(statuses) else NOT_SERVING)


async def _health_loop(running: RunningServer) -> None:
    while True:
        await asyncio.sleep(running.settings.health_interval_s)
        if running._stopped:
            return
        await _refresh_health(running)


async def start_server(
    components: Sequence[Component],
    settings: Settings,
    *,
    database_url: str | None = None,
    extras: dict[str, object] | None = None,
    auth: AuthSettings | None = None,
    http: HttpSettings | None = None,
) -> RunningServer:
    """Bind, start the components and the server; return once serving.

    `auth` chooses authentication and TLS (default: none, plaintext: tests and
    loopback development only). An all-in-one server under mesh authenticates its
    calls to itself with a secret minted here (no sidecar stands between it and
    itself to assert an identity); its peer channels to its own address send it.
    `http`, when it has a listen address, serves the same servicers on an HTTP port
    too (Connect, gRPC-Web, JSON; the console when on: services/common/http).
    """
    auth = auth or AuthSettings()
    extras = dict(extras or {})
    internal = (
        InternalCredential.mint() if auth.mode == "mesh" and extras.get("all_in_one") else None
    )
    auth = dataclasses.replace(auth, internal=internal)
    authenticator = make_authenticator(auth)
    gate = AuthGate(authenticator) if authenticator is not None else None
    # One admission for the process: a namespace's limits count its calls on both ports.
    limits = Admission(settings.admission)
    interceptors: list[grpc.aio.ServerInterceptor] = [
        ServiceInterceptor(gate, settings.slow_rpc_s, limits)
    ]
    transport = settings.transport
    cap = receive_cap(components, transport)
    server = grpc.aio.server(
        interceptors=interceptors,
        options=server_options(cap, transport),
        # Beyond this many calls in flight grpc answers RESOURCE_EXHAUSTED itself.
        maximum_concurrent_rpcs=transport.max_concurrent_rpcs or None,
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    credentials = server_credentials(auth)
    check_listen(settings.listen_address, "RUNIFOLD_LISTEN")
    try:
        if credentials is None:
            port = server.add_insecure_port(settings.listen_address)
        else:
            port = server.add_secure_port(settings.listen_address, credentials)
    except RuntimeError:  # grpc: "Failed to bind to address ..."
        port = 0
    if port == 0:
        raise ListenError(settings.listen_address, "RUNIFOLD_LISTEN", "gRPC could not bind it")
    host = settings.listen_address.rpartition(":")[0]
    address = f"{host}:{port}"
    if internal is not None:
        auth = dataclasses.replace(auth, internal=dataclasses.replace(internal, address=address))
    http_socket = None
    if http is not None and http.listen_address is not None:
        # Imported here: a process that serves no HTTP loads none of the HTTP stack.
        from services.common.http import port as http_port

        # Bound before anything starts: a taken port fails in one line, as RUNIFOLD_LISTEN.
        http_socket = http_port.bind(http.listen_address)
    try:
        return await _start(
            components,
            settings,
            server,
            health_servicer,
            address,
            port,
            database_url=database_url,
            extras=extras,
            auth=auth,
            gate=gate,
            limits=limits,
            cap=cap,
            http=http,
            http_socket=http_socket,
        )
    except BaseException:
        if http_socket is not None:
            http_socket.close()
        raise


async def _start(
    components: Sequence[Component],
    settings: Settings,
    server: grpc.aio.Server,
    health_servicer: health.aio.HealthServicer,
    address: str,
    port: int,
    *,
    database_url: str | None,
    extras: dict[str, object],
    auth: AuthSettings,
    gate: AuthGate | None,
    limits: Admission,
    cap: int,
    http: HttpSettings | None,
    http_socket: socket.socket | None,
) -> RunningServer:
    ctx = StartContext(
        settings=settings,
        self_address=address,
        database_url=database_url,
        extras=extras,
        auth=auth,
    )
    started: list[Component] = []
    try:
        for component in components:
            await component.start(ctx)
            started.append(component)
    except BaseException:
        for component in reversed(started):
            await component.stop()
        raise
    names = [reflection.SERVICE_NAME, health.SERVICE_NAME]  # LIVENESS is a health entry only
    recorder = None
    if http_socket is not None:
        from services.common.http.port import HandlerRecorder

        # The HTTP port serves the very servicers registered here: the recorder passes
        # each registration on to the gRPC server and keeps the method handlers.
        recorder = HandlerRecorder(server)
    for component in components:
        component.register(cast(grpc.aio.Server, recorder) if recorder is not None else server)
        names.extend(component.service_names)
    reflection.enable_server_reflection(names, server)
    running = RunningServer(server, address, port, health_servicer, components, settings)
    await health_servicer.set(LIVENESS, SERVING)
    await _refresh_health(running)
    await server.start()
    if http is not None and http_socket is not None and recorder is not None:
        from services.common.http.port import open_port

        try:
            running.http = await open_port(
                http,
                http_socket,
                handlers=recorder.handlers,
                gate=gate,
                limits=limits,
                auth=auth,
                slow_rpc_s=settings.slow_rpc_s,
                read_max_bytes=cap,
                transport=settings.transport,
            )
        except BaseException:
            await running.stop(grace=0)
            raise
    running._health_task = asyncio.create_task(_health_loop(running))
    log.info("server started", extra={"address": address, "services": [c.name for c in components]})
    return running


@contextlib.asynccontextmanager
async def serving(
    components: Sequence[Component],
    settings: Settings,
    *,
    database_url: str | None = None,
    extras: dict[str, object] | None = None,
    auth: AuthSettings | None = None,
    http: HttpSettings | None = None,
) -> AsyncIterator[RunningServer]:
    """Start a server for the duration of a block (tests and tools)."""
    running = await start_server(
        components, settings, database_url=database_url, extras=extras, auth=auth, http=http
    )
    try:
        yield running
    finally:
        await running.stop(grace=1.0)


async def serve_until_signal(running: RunningServer) -> None:
    """Block until SIGTERM or SIGINT, then shut down gracefully."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutdown requested")
    await running.stop()
