"""A server interceptor that wraps each method's handler once.

Shared by the guard (errors, metrics, logs) and the authentication interceptor.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc


class WrappingInterceptor(grpc.aio.ServerInterceptor):
    """An interceptor that wraps each method's handler once and reuses the wrapper."""

    def __init__(self) -> None:
        # Wrapped handlers per method: built once, not on every call.
        self._handlers: dict[str, grpc.RpcMethodHandler[Any, Any] | None] = {}

    def wrap(
        self, handler: grpc.RpcMethodHandler[Any, Any], method: str
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """The handler to serve `method` with instead of `handler`."""
        raise NotImplementedError

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method: Any = handler_call_details.method
        if isinstance(method, bytes):
            method = method.decode()
        if method in self._handlers:
            return self._handlers[method]
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        wrapped = self.wrap(handler, method)
        self._handlers[method] = wrapped
        return wrapped
