"""The HTTP port of a server process, put together: the Connect applications of the
services it hosts, the console, the listener."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

import grpc

from services.common.admission import Admission
from services.common.auth import AuthGate, AuthSettings
from services.common.http import listener
from services.common.http.bridge import HandlerRecorder, connect_applications
from services.common.http.console import Console
from services.common.http.listener import HttpPort, bind
from services.common.http.settings import HttpSettings
from services.common.settings import TransportLimits

__all__ = ["HandlerRecorder", "HttpPort", "bind", "open_port"]


async def open_port(
    settings: HttpSettings,
    sock: socket.socket,
    *,
    handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]],
    gate: AuthGate | None,
    limits: Admission | None,
    auth: AuthSettings,
    slow_rpc_s: float,
    read_max_bytes: int,
    transport: TransportLimits,
) -> HttpPort:
    """Serve the handlers' services (and the console, when on) on `sock`."""
    services = connect_applications(
        handlers, gate=gate, limits=limits, slow_rpc_s=slow_rpc_s, read_max_bytes=read_max_bytes
    )
    console = (
        Console(settings, gate=gate, auth_mode=auth.mode, methods=list(handlers)).app()
        if settings.console
        else None
    )
    return await listener.start(
        listener.application(services, console, settings, transport),
        transport,
        auth,
        sock,
        read_max_bytes,
    )
