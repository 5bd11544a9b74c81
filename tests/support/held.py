"""A gRPC proxy on loopback that forwards every unary call byte for byte, and can hold
the reply to the next call of a method until the test lets it go.

Put it between two services (point a `<SERVICE>_SERVICE_ADDR` at it) to stop one
service between a call to another and what it does with the answer, e.g.
MemoryService between its source check and its write, while the test makes
something happen in between. The proxy is plain grpc: a generic handler that
neither parses nor changes the messages.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc


class HoldingProxy:
    """Forwards to `target` (set once the real server is up); holds calls on request."""

    def __init__(self) -> None:
        self.target = ""
        self.address = ""
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None
        self._holds: dict[str, tuple[asyncio.Event, asyncio.Event]] = {}

    def hold_reply(self, method: str) -> tuple[asyncio.Event, asyncio.Event]:
        """Hold the reply to the next call of `method` (e.g. '/runifold.transcript.v1.
        TranscriptService/GetConversation'): the call is forwarded at once, its answer kept.
        Returns (held, release): `held` is set once the answer is in and waits, the test
        sets `release` to deliver it."""
        hold = (asyncio.Event(), asyncio.Event())
        self._holds[method] = hold
        return hold

    async def _forward(self, method: str, request: bytes, context: Any) -> bytes:
        hold = self._holds.pop(method, None)
        assert self._channel is not None
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = self._channel.unary_unary(method)
        metadata = tuple(
            (k, v) for k, v in context.invocation_metadata() or () if not k.startswith("grpc-")
        )
        try:
            reply: bytes = await call(request, metadata=metadata, timeout=context.time_remaining())
        except grpc.aio.AioRpcError as error:
            # abort takes a tuple of pairs (aio's trailing_metadata() is a Metadata); the
            # ErrorInfo travels in it (grpc-status-details-bin).
            trailers = tuple(error.trailing_metadata() or ())
            await context.abort(error.code(), error.details() or "", trailers)
            raise  # unreachable: abort raises
        if hold is not None:
            held, release = hold
            held.set()
            await asyncio.wait_for(release.wait(), 60)  # bounded: a stuck test fails
        return reply

    def _handler(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[bytes, bytes]:
        method = details.method

        async def behavior(request: bytes, context: Any) -> bytes:
            return await self._forward(method, request, context)

        return grpc.unary_unary_rpc_method_handler(behavior)

    async def start(self) -> None:
        proxy = self

        class Generic(grpc.GenericRpcHandler):
            def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
                return proxy._handler(handler_call_details)

        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers((Generic(),))
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self.address = f"127.0.0.1:{port}"

    def connect(self, target: str) -> None:
        """Forward to `target` from now on."""
        self.target = target
        self._channel = grpc.aio.insecure_channel(target)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
        if self._channel is not None:
            await self._channel.close()


@contextlib.asynccontextmanager
async def holding_proxy() -> AsyncIterator[HoldingProxy]:
    """A started HoldingProxy for the duration of a block (call `connect` before use)."""
    proxy = HoldingProxy()
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()
