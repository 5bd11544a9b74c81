"""The hosted servicers over Connect, gRPC-Web and HTTP JSON, behind the same guard.

The very servicers a process registers on its gRPC server serve its HTTP port:
while the components register, `HandlerRecorder` stands in for the gRPC server,
passes every registration on and keeps each method's handler. Each service is
then served by the ASGI application that protoc-gen-connectrpc generated for it
(`runifold.<service>.v1.*_connect`, which speaks Connect, gRPC-Web and JSON and owns
the framing), over `_Bridge`, which hands each call to the gRPC servicer's own
method. New RPCs, server-streaming ones included, are served on both transports
as soon as a servicer has them.

The guard is the gRPC guard's (services/common/interceptors.py), step for step:

1. `Guard.on_start`, a Connect metadata interceptor, runs before the request body is
   read: call id, method and deadline for logs and outbound calls, the RPC
   metrics and span, and authentication from the headers (the same `AuthGate`: a
   JWT bearer in `authorization`, or under mesh the sidecar's
   `x-forwarded-client-cert` from a loopback peer). An unauthenticated caller never
   costs a read or a parse.
2. connectrpc reads the body, at most the gRPC listener's receive cap
   (RESOURCE_EXHAUSTED beyond it), and parses it (INVALID_REQUEST when it is not a
   message of the method's type).
3. `_Bridge` authorizes the request's namespace (filled from the identity when
   empty, PERMISSION_DENIED when not granted), admits it against its namespace's
   limits (the process's one `Admission`, shared with gRPC), calls the servicer and
   maps a DomainError to a Connect error with the same code, reason and details;
   anything else is INTERNAL with a generic message (the trace goes to the log).
4. `Guard.on_end` records the outcome under the gRPC code's name.
"""

from __future__ import annotations

import contextvars
import importlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import grpc
from connectrpc.errors import ConnectError
from connectrpc.method import StreamType
from connectrpc.request import RequestContext
from google.protobuf import descriptor_pool

from services.common import admission, metrics
from services.common.admission import Admission
from services.common.auth import AuthGate, Identity
from services.common.deadlines import deadline_var
from services.common.errors import Code, DomainError, StoreUnavailable
from services.common.http.errors import GRPC_NAMES, connect_error, request_codecs
from services.common.interceptors import RpcCall, call_id_of
from services.common.logs import CALL_ID_HEADER, call_id_var, method_var

log = logging.getLogger("runifold.rpc")

Metadata = Sequence[tuple[str, str]]
ASGIApp = Callable[..., Any]

# The identity `Guard.on_start` authenticated, for `_Bridge` to authorize the parsed
# request with (the same task runs both, and each request runs in a task of its own).
_caller: contextvars.ContextVar[Identity | None] = contextvars.ContextVar(
    "http_caller", default=None
)


class HandlerRecorder:
    """Stands in for the gRPC server while components register their servicers: every
    registration goes on to the server, and each method's handler is kept by its path
    ("/runifold.transcript.v1.TranscriptService/GetConversation")."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server
        self.handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        self._server.add_registered_method_handlers(service_name, method_handlers)
        for name, handler in method_handlers.items():
            self.handlers[f"/{service_name}/{name}"] = handler

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


def _path(ctx: RequestContext[Any, Any]) -> str:
    return f"/{ctx.method.service_name}/{ctx.method.name}"


def grpc_peer(client_address: str | None) -> str:
    """The HTTP client's address in gRPC's peer form ("ipv4:127.0.0.1:5000"), which the
    mesh authenticator checks for a loopback sidecar. The TCP peer, never a forwarded
    address: the server takes no X-Forwarded-For."""
    if not client_address:
        return ""
    host, _, port = client_address.rpartition(":")
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


class _TracingCarrier:
    """What the RPC span reads of a call: its metadata (for `traceparent`)."""

    def __init__(self, metadata: Metadata) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> Metadata:
        return self._metadata


class Guard:
    """The first steps of the guard, before the body is read (a Connect metadata
    interceptor), and the last, when the call has ended."""

    def __init__(self, gate: AuthGate | None, slow_rpc_s: float) -> None:
        self.gate = gate
        self.slow_rpc_s = slow_rpc_s

    async def on_start(self, ctx: RequestContext[Any, Any]) -> RpcCall:
        method = _path(ctx)
        metadata = [(key.lower(), value) for key, value in ctx.request_headers.allitems()]
        cid = call_id_of(metadata)
        call_id_var.set(cid)
        method_var.set(method)
        left_ms = ctx.timeout_ms
        deadline_var.set(time.monotonic() + left_ms / 1000 if left_ms is not None else None)
        ctx.response_headers[CALL_ID_HEADER] = cid
        kind = "server_stream" if ctx.method.stream_type is StreamType.SERVER_STREAM else "unary"
        call = RpcCall(method, kind, _TracingCarrier(metadata), cid, self.slow_rpc_s)
        _caller.set(None)
        if self.gate is not None and self.gate.applies(method):
            try:
                _caller.set(
                    self.gate.authenticate_metadata(metadata, grpc_peer(ctx.client_address))
                )
            except DomainError as error:
                call.code = error.code.value
                call.finish()
                raise connect_error(error) from None
        return call

    async def on_end(
        self, call: RpcCall, ctx: RequestContext[Any, Any], error: Exception | None
    ) -> None:
        try:
            if error is None:
                call.code = "OK"
            elif isinstance(error, ConnectError):
                call.code = GRPC_NAMES[error.code]
            else:
                # Not ours (the library's own failures are ConnectErrors): answered as
                # INTERNAL rather than with the exception's text.
                log.error("unhandled error", exc_info=error)
                call.code = "INTERNAL"
                raise connect_error(_internal()) from None
        finally:
            call.finish()


def _internal() -> DomainError:
    return DomainError(Code.INTERNAL, "INTERNAL", "internal error")


class _HttpContext:
    """The servicer's `context` argument on the HTTP port. The servicers read nothing of
    it today (the guard has done what needs the call); these are the parts of
    grpc.aio.ServicerContext a handler could fairly ask of any transport."""

    def __init__(self, ctx: RequestContext[Any, Any], metadata: Metadata) -> None:
        self._ctx = ctx
        self._metadata = metadata

    def invocation_metadata(self) -> Metadata:
        return self._metadata

    def peer(self) -> str:
        return grpc_peer(self._ctx.client_address)

    def time_remaining(self) -> float | None:
        left = self._ctx.timeout_ms
        return None if left is None else max(0.0, left / 1000)

    def cancelled(self) -> bool:
        return False

    def set_trailing_metadata(self, metadata: Iterable[tuple[str, str]]) -> None:
        for key, value in metadata:
            self._ctx.response_trailers[key] = value


class _Servicer(Protocol):
    def __call__(self, request: Any, context: Any) -> Any: ...


class _Bridge:
    """The service object a generated Connect application calls (`get_conversation`,
    `stream_conversation`, ...): each method of the service's Connect protocol is the
    last steps of the guard around the gRPC servicer's handler of that RPC."""

    def __init__(
        self,
        protocol: type,
        handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]],
        gate: AuthGate | None,
        limits: Admission | None,
    ) -> None:
        self._methods = frozenset(name for name in vars(protocol) if not name.startswith("_"))
        self._handlers = handlers
        self._gate = gate
        self._limits = limits

    def __getattr__(self, name: str) -> Callable[[Any, RequestContext[Any, Any]], Any]:
        if name.startswith("_") or name not in self._methods:
            raise AttributeError(name)
        return self._dispatch

    def _dispatch(self, request: Any, ctx: RequestContext[Any, Any]) -> Any:
        # A coroutine for a unary method, an async iterator for a server-streaming one:
        # the application awaits the one and iterates the other.
        method = _path(ctx)
        handler = self._handlers.get(method)
        if handler is None:  # in the contract, but no servicer here implements it
            raise connect_error(
                DomainError(Code.UNIMPLEMENTED, "UNIMPLEMENTED", "method not implemented")
            )
        # The published types describe sync handlers; the servicers here are aio ones.
        if ctx.method.stream_type is StreamType.SERVER_STREAM:
            streaming: Any = handler.unary_stream
            return self._stream(method, streaming, request, ctx)
        unary: Any = handler.unary_unary
        return self._unary(method, unary, request, ctx)

    def _admit(self, method: str, request: Any) -> None:
        if self._gate is not None and self._gate.applies(method):
            identity = _caller.get()
            if identity is None:  # on_start authenticates every guarded call
                raise _internal()
            self._gate.admit(request, identity)
        if self._limits is not None and method.startswith("/runifold."):
            self._limits.enter(method, request)

    async def _unary(
        self, method: str, behavior: _Servicer, request: Any, ctx: RequestContext[Any, Any]
    ) -> Any:
        try:
            self._admit(method, request)
            return await behavior(request, _HttpContext(ctx, _metadata(ctx)))
        except Exception as exc:
            raise _connect(exc) from None
        finally:
            admission.leave()

    async def _stream(
        self, method: str, behavior: _Servicer, request: Any, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[Any]:
        try:
            self._admit(method, request)
            if method in GRPC_ONLY:
                raise DomainError(
                    Code.UNIMPLEMENTED,
                    "GRPC_ONLY",
                    f"{method.rsplit('/', 1)[-1]} is served over gRPC only: its stream is "
                    "written as events happen, for as long as the client watches",
                )
            if not inspect.isasyncgenfunction(behavior):
                # Every streaming servicer here is an async generator; one that writes
                # through context.write would need that part of the context too.
                log.error("streaming servicer is not an async generator", extra={"rpc": method})
                raise _internal()
            async for item in behavior(request, _HttpContext(ctx, _metadata(ctx))):
                yield item
        except Exception as exc:
            raise _connect(exc) from None
        finally:
            admission.leave()


# Server streams that write as events happen, through context.write, for as long as
# their client wants (WatchConversation, WatchMemories): gRPC only, refused here after
# authorization.
GRPC_ONLY = frozenset(
    {
        "/runifold.transcript.v1.TranscriptService/WatchConversation",
        "/runifold.memory.v1.MemoryService/WatchMemories",
    }
)


def _metadata(ctx: RequestContext[Any, Any]) -> Metadata:
    return [(key.lower(), value) for key, value in ctx.request_headers.allitems()]


def _connect(exc: Exception) -> ConnectError:
    """The Connect error a failed call answers with (as the gRPC guard's `fail`)."""
    if isinstance(exc, ConnectError):
        return exc
    if isinstance(exc, DomainError):
        if isinstance(exc, StoreUnavailable):
            metrics.STORE_ERRORS.labels(exc.store).inc()
        return connect_error(exc)
    log.error("unhandled error", exc_info=exc, extra={"error_type": type(exc).__name__})
    return connect_error(_internal())


def connect_applications(
    handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]],
    *,
    gate: AuthGate | None,
    limits: Admission | None,
    slow_rpc_s: float,
    read_max_bytes: int,
) -> dict[str, ASGIApp]:
    """The generated Connect application of each service that has handlers, by its full
    name, over the handlers and behind the guard."""
    guard = Guard(gate, slow_rpc_s)
    applications: dict[str, ASGIApp] = {}
    for service_name in sorted({path.split("/")[1] for path in handlers}):
        service = descriptor_pool.Default().FindServiceByName(service_name)
        # runifold/transcript/v1/transcript_service.proto -> ..._connect (make gen).
        module = importlib.import_module(
            service.file.name.removesuffix(".proto").replace("/", ".") + "_connect"
        )
        protocol = getattr(module, service.name)
        application = getattr(module, f"{service.name}ASGIApplication")
        applications[service_name] = application(
            _Bridge(protocol, handlers, gate, limits),
            interceptors=[guard],
            read_max_bytes=read_max_bytes,
            codecs=request_codecs(),
        )
    return applications
