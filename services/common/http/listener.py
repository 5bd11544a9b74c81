"""The HTTP port of a server process: uvicorn in the process's own event loop.

One ASGI application routes `/<package>.<Service>/<Method>` to that service's Connect
application (services/common/http/bridge.py) and, when the console is on, everything
else to the console (services/common/http/console.py). CORS headers are added only
for the origins RUNIFOLD_HTTP_CORS_ORIGINS names (starlette's CORSMiddleware);
without it a page of another origin cannot read any answer.

uvicorn runs as a task of the loop that serves gRPC, so an RPC over HTTP runs in the
same loop, with the same pools, admission and clients as one over gRPC. It leaves the
process's signals and logging alone (the process stops both listeners on SIGTERM),
takes the TCP peer as the client (never X-Forwarded-For: the mesh check needs the
real peer), and serves TLS with the gRPC listener's certificate when one is set
(mutual when a client CA is).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse

from services.common.auth import AuthSettings
from services.common.background import cancel_and_wait
from services.common.http.bridge import ASGIApp
from services.common.http.refusals import WithRefusalBodies, refusal_error, send_refusal
from services.common.http.settings import HttpSettings
from services.common.listen import ListenError, bind_cause
from services.common.settings import TransportLimits

log = logging.getLogger(__name__)

# What a browser may send and read across origins (when CORS is on): the Connect and
# gRPC-Web protocol headers, credentials and the call id (the mesh's request id too).
CORS_REQUEST_HEADERS = [
    "authorization",
    "content-type",
    "connect-protocol-version",
    "connect-timeout-ms",
    "grpc-timeout",
    "x-grpc-web",
    "x-user-agent",
    "x-call-id",
    "x-request-id",
]
CORS_RESPONSE_HEADERS = [
    "grpc-status",
    "grpc-message",
    "grpc-status-details-bin",
    "x-call-id",
]


class Router:
    """Sends each request to the Connect application of the service its path names, or
    to the console, or answers 404 with a body that says what the port serves
    (services/common/http/refusals.py; it also gives connectrpc's bodiless 404, 405
    and 415 their bodies).

    At most `max_rpcs` calls are in flight on the port (RUNIFOLD_MAX_CONCURRENT_RPCS, as
    on the gRPC listener; 0: no limit); one more is answered RESOURCE_EXHAUSTED before
    its body is read, as grpc answers it.
    """

    def __init__(
        self, services: Mapping[str, ASGIApp], console: ASGIApp | None, max_rpcs: int = 0
    ) -> None:
        self.services: dict[str, ASGIApp] = {
            name: WithRefusalBodies(app, sorted(services)) for name, app in services.items()
        }
        self.console = console
        self.max_rpcs = max_rpcs
        self.in_flight = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # no websockets; lifespan is off
            return
        service = scope["path"].split("/", 2)[1] if scope["path"].count("/") >= 2 else ""
        application = self.services.get(service)
        if application is not None:
            if _is_grpc(scope):
                await _not_here(scope, receive, send)
                return
            if self.max_rpcs and self.in_flight >= self.max_rpcs:
                await _too_many(scope, receive, send)
                return
            self.in_flight += 1
            try:
                await application(scope, receive, send)
            finally:
                self.in_flight -= 1
        elif self.console is not None and not _names_a_service(scope["path"]):
            await self.console(scope, receive, send)
        else:
            error = refusal_error(404, scope, sorted(self.services))
            await send_refusal(404, error, scope, send)


def _names_a_service(path: str) -> bool:
    """True for a path of an RPC's shape (/<package>.<Service>/<Method>), which the
    console never serves."""
    service, _, method = path.strip("/").partition("/")
    return "." in service and bool(method) and "/" not in method


def _is_grpc(scope: dict[str, Any]) -> bool:
    """True for gRPC proper (HTTP/2 with trailers, which this HTTP/1.1 port cannot send)."""
    for key, value in scope.get("headers", ()):
        if key == b"content-type":
            kind = value.split(b";")[0].strip().lower()
            return kind.startswith(b"application/grpc") and not kind.startswith(
                b"application/grpc-web"
            )
    return False


async def _not_here(scope: dict[str, Any], receive: Any, send: Any) -> None:
    response = JSONResponse(
        {
            "code": "unimplemented",
            "message": "gRPC is served on the gRPC port (RUNIFOLD_LISTEN); this port speaks "
            "Connect, gRPC-Web and JSON",
        },
        status_code=415,
    )
    await response(scope, receive, send)


async def _too_many(scope: dict[str, Any], receive: Any, send: Any) -> None:
    # Connect's error shape and status for RESOURCE_EXHAUSTED (429), with grpc's words; a
    # gRPC-Web client reads the status from the headers of an empty body.
    headers = {"grpc-status": "8", "grpc-message": "Concurrent RPC limit exceeded!"}
    response = JSONResponse(
        {"code": "resource_exhausted", "message": "Concurrent RPC limit exceeded!"},
        status_code=429,
        headers=headers,
    )
    await response(scope, receive, send)


def application(
    services: Mapping[str, ASGIApp],
    console: ASGIApp | None,
    settings: HttpSettings,
    transport: TransportLimits,
) -> ASGIApp:
    """The whole port's ASGI application."""
    app: ASGIApp = Router(services, console, transport.max_concurrent_rpcs)
    if settings.cors_origins:
        app = CORSMiddleware(
            app,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=CORS_REQUEST_HEADERS,
            expose_headers=CORS_RESPONSE_HEADERS,
            max_age=600,
        )
    return app


class _Server(uvicorn.Server):
    # The process handles SIGTERM and SIGINT itself (services/common/server.py), and stops
    # this listener with the gRPC one.
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def bind(address: str) -> socket.socket:
    """A listening socket at host:port (port 0: any free port), or ListenError naming
    RUNIFOLD_HTTP_LISTEN."""
    host, _, port = address.rpartition(":")
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM)
        family, kind, proto, _, sockaddr = infos[0]
        sock = socket.socket(family, kind, proto)
    except socket.gaierror as exc:
        cause = f"unknown host ({exc.strerror})"
        raise ListenError(address, "RUNIFOLD_HTTP_LISTEN", cause) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise ListenError(address, "RUNIFOLD_HTTP_LISTEN", bind_cause(exc)) from None
    sock.setblocking(False)
    return sock


@dataclass
class HttpPort:
    """A running HTTP listener."""

    address: str
    url: str
    # The largest request body read (the gRPC listener's receive cap).
    read_max_bytes: int
    _server: _Server
    _task: asyncio.Task[None]

    async def stop(self, grace: float) -> None:
        """Stop accepting, let requests in progress finish within `grace`, then close."""
        self._server.config.timeout_graceful_shutdown = max(1, round(grace))
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), grace + 5)
        except TimeoutError:
            self._server.force_exit = True
            await cancel_and_wait(self._task)


async def start(
    app: ASGIApp,
    transport: TransportLimits,
    auth: AuthSettings,
    sock: socket.socket,
    read_max_bytes: int,
) -> HttpPort:
    """Serve `app` on `sock` (from `bind`) until `HttpPort.stop`."""
    tls: dict[str, Any] = {}
    if auth.tls_cert_file:
        tls = {"ssl_certfile": auth.tls_cert_file, "ssl_keyfile": auth.tls_key_file}
        if auth.tls_client_ca_file:
            tls |= {"ssl_ca_certs": auth.tls_client_ca_file, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    config = uvicorn.Config(
        app,
        http="h11",
        ws="none",
        lifespan="off",
        log_config=None,
        log_level="warning",
        access_log=False,  # the RPC access lines are the guard's (DEBUG)
        proxy_headers=False,
        server_header=False,
        # An idle keep-alive connection closes after 5 s (browsers open another).
        timeout_keep_alive=5,
        # Beyond RUNIFOLD_MAX_CONNECTIONS connections (and requests) at once, 503.
        limit_concurrency=transport.max_connections or None,
        **tls,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="runifold-http")
    # uvicorn says it is serving through a flag; its start-up is a few loop turns.
    while not server.started:
        if task.done():
            task.result()  # raises what stopped it
            raise RuntimeError("the HTTP listener stopped while starting")
        await asyncio.sleep(0.01)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if tls else "http"
    return HttpPort(f"{shown}:{port}", f"{scheme}://{shown}:{port}", read_max_bytes, server, task)
