"""A TCP proxy with faults, between the services and what they call (each other, and
PostgreSQL): the campaign's network nemesis.

Hand-written (no library injects faults into a plain TCP stream here: toxiproxy is a Go
server not packaged for this machine). Faults, each until `heal()`:

- `delay(seconds)`: every chunk waits that long in each direction;
- `drop()`: a partition: nothing is forwarded either way (TCP holds the bytes, as a
  network that drops packets makes the peer retransmit), new connections are accepted
  and go nowhere;
- `reset()`: every open connection is closed with a RST, at once (not a lasting fault).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct


class Proxy:
    """Listens on 127.0.0.1:`port` (0: any) and forwards to 127.0.0.1:`upstream_port`."""

    def __init__(self, upstream_port: int, port: int = 0, name: str = "") -> None:
        self.upstream_port = upstream_port
        self.port = port
        self.name = name or f"proxy-{upstream_port}"
        self.delay_s = 0.0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self.reset()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- faults ---------------------------------------------------------------------

    def delay(self, seconds: float) -> None:
        self.delay_s = seconds

    def drop(self) -> None:
        self._flowing.clear()

    def heal(self) -> None:
        self.delay_s = 0.0
        self._flowing.set()

    def reset(self) -> None:
        """Close every open connection with a RST (the peers see ECONNRESET)."""
        for client, upstream in list(self._links):
            for writer in (client, upstream):
                _abort(writer)
        self._links.clear()

    # -- forwarding -----------------------------------------------------------------

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._flowing.wait()
            try:
                up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            except OSError:
                _abort(client_w)
                return
            link = (client_w, up_w)
            self._links.add(link)
            try:
                await asyncio.gather(self._pump(client_r, up_w), self._pump(up_r, client_w))
            finally:
                self._links.discard(link)
                for writer in link:
                    writer.close()
        except asyncio.CancelledError:
            pass
        finally:
            self._tasks.discard(task)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError, asyncio.IncompleteReadError):
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                await self._flowing.wait()
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)  # the injected latency
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError):
            if writer.can_write_eof():
                writer.write_eof()


def _abort(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
