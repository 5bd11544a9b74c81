"""Server interceptor: call ids, authentication, error mapping, RPC metrics and the
access log (DEBUG; errors and slow calls at WARNING).

Every handler runs inside the guard: a `DomainError` becomes its canonical
status with ErrorInfo; any other exception becomes INTERNAL with a generic
message (the stack trace goes to the log, never to the client).

The guard reads each request off the stream itself, and only after the call is
authenticated from its metadata (`AuthGate`): a caller without credentials never
costs a read or a parse, however big the request it sends (grpc would otherwise
hold the whole message, twice, before any of our code ran, and the allocator
keeps much of that afterwards). A request
whose bytes are not a valid message of its type (corrupt wire format, invalid
UTF-8 in a string field) is INVALID_ARGUMENT / INVALID_REQUEST: grpc would
otherwise answer UNKNOWN with the parser's exception text.

Once the request is read and authorized, its namespace is known, and the
expensive calls pass admission (services/common/admission.py): a namespace at
its concurrency limit for that kind of call is refused before the handler runs
(RESOURCE_EXHAUSTED / NAMESPACE_CONCURRENCY_LIMIT with RetryInfo); the slot is
given back when the call ends.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Protocol

import grpc
from google.protobuf.message import DecodeError

from services.common import admission, metrics, tracing
from services.common.admission import Admission
from services.common.auth import AuthGate
from services.common.deadlines import deadline_var
from services.common.errors import (
    Code,
    DomainError,
    StoreUnavailable,
    StreamStalled,
    invalid_argument,
)
from services.common.logs import CALL_ID_HEADER, MESH_REQUEST_ID_HEADER, call_id_var, method_var
from services.common.status import to_status
from services.common.wrapping import WrappingInterceptor

log = logging.getLogger("runifold.rpc")

# Server-made call ids: a random per-process prefix and a counter (unique, and
# cheaper than drawing randomness on every call).
_ID_PREFIX = secrets.token_hex(6) + "-"
_ID_COUNTER = itertools.count(1)
_MAX_CALL_ID = 128


def _usable(value: str | bytes) -> bool:
    return isinstance(value, str) and 0 < len(value) <= _MAX_CALL_ID


def call_id_of(metadata: Iterable[tuple[str, str | bytes]]) -> str:
    """The caller's `x-call-id` when it sent a usable one, else the mesh's
    `x-request-id` (a sidecar's correlation id), else one made here."""
    mesh = ""
    for key, value in metadata:
        if key == CALL_ID_HEADER and _usable(value):
            return str(value)
        if key == MESH_REQUEST_ID_HEADER and not mesh and _usable(value):
            mesh = str(value)
    return mesh or f"{_ID_PREFIX}{next(_ID_COUNTER):x}"


def _bind_context(context: grpc.aio.ServicerContext[Any, Any], method: str) -> str:
    """Record the call id, method and deadline for logs and outbound calls."""
    bound = call_id_of(context.invocation_metadata() or ())
    call_id_var.set(bound)
    method_var.set(method)
    left = context.time_remaining()
    deadline_var.set(time.monotonic() + left if left is not None else None)
    return bound


def _internal() -> DomainError:
    return DomainError(Code.INTERNAL, "INTERNAL", "internal error")


def _undecodable() -> DomainError:
    return invalid_argument(
        "INVALID_REQUEST", "the request is not a valid protobuf message of this method's type"
    )


Context = grpc.aio.ServicerContext[Any, Any]
Admit = Callable[[Context], Awaitable[Any]]


def _admission(
    deserializer: Callable[[bytes], Any] | None,
    gate: AuthGate | None,
    method: str,
    limits: Admission | None = None,
) -> Admit:
    """What reads the call's request for the handler: authenticate from the metadata
    first (when the gate guards this method), then read the request bytes off the
    stream and parse them, then authorize the parsed request's namespace, then admit
    the call against its namespace's limits."""
    guarded = gate if gate is not None and gate.applies(method) else None
    limited = limits if limits is not None and method.startswith("/runifold.") else None

    async def admit(context: Context) -> Any:
        identity = guarded.authenticate(context) if guarded is not None else None
        data = await context.read()
        if data is grpc.aio.EOF:  # the client sent no request, or went away
            if context.cancelled():
                raise asyncio.CancelledError
            raise _undecodable()
        try:
            request = deserializer(data) if deserializer is not None else data
        except DecodeError:
            raise _undecodable() from None
        if guarded is not None and identity is not None:
            guarded.admit(request, identity)
        if limited is not None:
            limited.enter(method, request)
        return request

    return admit


@functools.cache
def _children(method: str, grpc_type: str) -> tuple[Any, Any, Any]:
    """The labelled metric children of one method (looked up once)."""
    _, service, name = method.split("/", 2) if method.count("/") == 2 else ("", "", method)
    labels = (grpc_type, service, name)
    return (metrics.RPC_STARTED.labels(*labels), labels, metrics.RPC_SECONDS.labels(*labels))


@functools.cache
def _handled(labels: tuple[str, str, str], code: str) -> Any:
    return metrics.RPC_HANDLED.labels(*labels, code)


# Codes that answer the request as the contract says (a conflict, a missing resource, a
# bad request): the caller learns from them, the operator has nothing to do. Their access
# lines are DEBUG, with the OK ones; every other code is a WARNING.
_EXPECTED_CODES = frozenset(
    {
        "OK",
        "NOT_FOUND",
        "ABORTED",
        "ALREADY_EXISTS",
        "FAILED_PRECONDITION",
        "CANCELLED",
        "INVALID_ARGUMENT",
    }
)


# Streams that last as long as their client wants (a watch): never "slow".
LONG_LIVED = frozenset(
    {
        "/runifold.transcript.v1.TranscriptService/WatchConversation",
        "/runifold.memory.v1.MemoryService/WatchMemories",
    }
)


class MetadataCarrier(Protocol):
    """What the RPC span reads of a call (for `traceparent`): a gRPC ServicerContext, or
    the HTTP port's stand-in for one."""

    def invocation_metadata(self) -> Any: ...


class RpcCall:
    """Bookkeeping of one RPC: labels, timing, the final code. The HTTP port's calls
    (services/common/http/bridge.py) keep theirs with it too: one set of RPC metrics,
    access lines and spans, whichever transport carried the call."""

    __slots__ = ("code", "labels", "method", "seconds", "slow_s", "span", "start")

    def __init__(
        self,
        method: str,
        grpc_type: str,
        context: MetadataCarrier,
        call_id: str,
        slow_s: float,
    ) -> None:
        started, self.labels, self.seconds = _children(method, grpc_type)
        self.method = method
        self.slow_s = slow_s
        self.code = "OK"
        # None unless tracing is on (then the span is current while the handler runs).
        self.span = tracing.start_server_span(method, context, call_id)
        self.start = time.perf_counter()
        started.inc()

    async def fail(
        self, context: grpc.aio.ServicerContext[Any, Any], exc: BaseException, call_id: str
    ) -> None:
        if isinstance(exc, DomainError):
            error = exc
            if isinstance(exc, StoreUnavailable):
                metrics.STORE_ERRORS.labels(exc.store).inc()
        else:
            # The traceback names a database driver's error by its class and SQLSTATE
            # only: its text quotes the data (services/common/logs.py).
            log.error("unhandled error", exc_info=exc, extra={"error_type": type(exc).__name__})
            error = _internal()
        self.code = error.code.value
        status = to_status(error)
        if isinstance(error, StreamStalled):
            context.set_code(status.code)
            context.set_details(status.details)
            context.set_trailing_metadata((*status.trailing_metadata, (CALL_ID_HEADER, call_id)))
            return
        await context.abort(
            status.code,
            status.details,
            (*status.trailing_metadata, (CALL_ID_HEADER, call_id)),
        )

    def finish(self) -> None:
        elapsed = time.perf_counter() - self.start
        _handled(self.labels, self.code).inc()
        self.seconds.observe(elapsed)
        # One line per RPC costs the busy paths a good share of their throughput: the
        # access log is DEBUG; errors and calls slower than RUNIFOLD_SLOW_RPC_S warn.
        level = (
            logging.DEBUG
            if self.code in _EXPECTED_CODES and (elapsed < self.slow_s or self.method in LONG_LIVED)
            else logging.WARNING
        )
        if log.isEnabledFor(level):
            log.log(
                level,
                "rpc",
                extra={
                    "grpc_service": self.labels[1],
                    "grpc_method": self.method,
                    "grpc_code": self.code,
                    "duration_ms": round(elapsed * 1000, 3),
                },
            )
        if self.span is not None:
            self.span.end(self.code)


def _wrap_unary(
    behavior: Callable[[Any, Any], Awaitable[Any]],
    admit: Admit,
    method: str,
    slow_s: float,
    grpc_type: str = "unary",
) -> Callable[[object, Context], Awaitable[Any]]:
    """Guard a coroutine handler (unary, or streaming through context.write)."""

    async def handler(requests: object, context: Context) -> Any:
        # `requests` goes unused: `admit` reads the one request through the context.
        call_id = _bind_context(context, method)
        call = RpcCall(method, grpc_type, context, call_id, slow_s)
        try:
            response = await behavior(await admit(context), context)
            context.set_trailing_metadata(((CALL_ID_HEADER, call_id),))
            return response
        except grpc.aio.AbortError:
            call.code = (context.code() or grpc.StatusCode.UNKNOWN).name
            raise
        except Exception as exc:
            await call.fail(context, exc, call_id)
        except BaseException:
            call.code = "CANCELLED"
            raise
        finally:
            admission.leave()
            call.finish()

    return handler


def _wrap_stream(
    behavior: Callable[[Any, Any], AsyncIterator[Any]], admit: Admit, method: str, slow_s: float
) -> Callable[[object, Context], AsyncIterator[Any]]:
    async def handler(requests: object, context: Context) -> AsyncIterator[Any]:
        call_id = _bind_context(context, method)
        call = RpcCall(method, "server_stream", context, call_id, slow_s)
        try:
            async for item in behavior(await admit(context), context):
                yield item
            context.set_trailing_metadata(((CALL_ID_HEADER, call_id),))
        except grpc.aio.AbortError:
            call.code = (context.code() or grpc.StatusCode.UNKNOWN).name
            raise
        except Exception as exc:
            await call.fail(context, exc, call_id)
        except BaseException:
            call.code = "CANCELLED"
            raise
        finally:
            admission.leave()
            call.finish()

    return handler


class ServiceInterceptor(WrappingInterceptor):
    """Applies the guard to every unary and server-streaming RPC; with a gate, the guard
    authenticates each call to a Runifold service before it reads the request; with
    `limits`, it admits the expensive calls against their namespace's limits."""

    def __init__(
        self,
        gate: AuthGate | None = None,
        slow_rpc_s: float = 5.0,
        limits: Admission | None = None,
    ) -> None:
        super().__init__()
        self.gate = gate
        self.slow_rpc_s = slow_rpc_s
        self.limits = limits

    def wrap(
        self, handler: grpc.RpcMethodHandler[Any, Any], method: str
    ) -> grpc.RpcMethodHandler[Any, Any]:
        return _wrap(handler, method, self.gate, self.slow_rpc_s, self.limits)


def _wrap(
    handler: grpc.RpcMethodHandler[Any, Any],
    method: str,
    gate: AuthGate | None,
    slow_s: float,
    limits: Admission | None = None,
) -> grpc.RpcMethodHandler[Any, Any]:
    # Served as request-streaming handlers (the same bytes on the wire: one length-
    # prefixed message, then the half-close), so that grpc reads no request before the
    # guard asks for it: a unary handler gets its request read, in full, before any
    # code of ours runs. An unauthenticated call is answered from its metadata while
    # its request still waits in the transport, unread (at most a flow-control window).
    admit = _admission(handler.request_deserializer, gate, method, limits)
    if handler.unary_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            _wrap_unary(handler.unary_unary, admit, method, slow_s),
            request_deserializer=None,
            response_serializer=handler.response_serializer,
        )
    if handler.unary_stream is not None:
        # The published types describe sync handlers; aio ones are coroutines
        # or async generators.
        behavior: Any = handler.unary_stream
        wrapped: Any = (
            _wrap_stream(behavior, admit, method, slow_s)
            if inspect.isasyncgenfunction(behavior)
            else _wrap_unary(behavior, admit, method, slow_s, "server_stream")
        )
        return grpc.stream_stream_rpc_method_handler(
            wrapped,
            request_deserializer=None,
            response_serializer=_serialized_or(handler.response_serializer),
        )
    return handler


def _serialized_or(serializer: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """A stream's serializer that passes bytes through: a handler that writes through
    context.write may serialize a message itself and let it go before the write waits
    (WatchConversation), so that a stalled write holds the bytes alone."""
    if serializer is None:
        return None

    def serialize(message: Any) -> bytes:
        return message if isinstance(message, bytes) else serializer(message)

    return serialize
