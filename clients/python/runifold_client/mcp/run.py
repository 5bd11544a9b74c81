"""Serving the MCP server over stdio or Streamable HTTP (uvicorn on a socket bound here,
so that port 0 works and the address is printed once it is known)."""

from __future__ import annotations

import socket
import sys
from typing import Any

import anyio
import uvicorn

from runifold_client.mcp.server import build_server
from runifold_client.mcp.settings import McpSettings


async def serve(settings: McpSettings) -> None:
    """Serve until stdin closes (stdio) or the process is stopped (HTTP)."""
    server = build_server(settings)
    runifold: Any = server.runifold  # type: ignore[attr-defined]
    try:
        if settings.transport == "stdio":
            await server.run_stdio_async()
        else:
            await _serve_http(server, settings)
    finally:
        await runifold.client.close()


async def _serve_http(server: Any, settings: McpSettings) -> None:
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    sock.listen(128)
    host, port = sock.getsockname()[:2]
    # The SDK protects a loopback listener against DNS rebinding by its Host header.
    app = server.streamable_http_app(host=settings.host)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    print(
        f"runifold mcp: serving Streamable HTTP at http://{shown}:{port}/mcp "
        f"(auth {settings.auth}, Runifold at {settings.target})",
        file=sys.stderr,
        flush=True,
    )
    await uvicorn.Server(config).serve(sockets=[sock])


def main(settings: McpSettings) -> int:
    """Run the server to its end; the exit status."""
    try:
        anyio.run(serve, settings)
    except KeyboardInterrupt:
        return 130
    return 0
