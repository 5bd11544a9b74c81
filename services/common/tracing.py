"""OpenTelemetry tracing: a server span per RPC, client spans for peer calls, W3C propagation.

Off by default. It turns on when an OTLP endpoint is configured
(`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) or when
`RUNIFOLD_TRACING=otlp`; `RUNIFOLD_TRACING=off` keeps it off whatever else is
set. While off, the only cost on the RPC path is one `is None` test: the
OpenTelemetry SDK is not even imported.

Context travels in gRPC metadata as the W3C `traceparent` (and `tracestate`)
headers, so a mesh or any OpenTelemetry-instrumented client joins the trace.

Span attributes carry identifiers, the method and the status only: never a
namespace, message text, summary or memory content.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.common.logs import trace_id_var

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger(__name__)

# gRPC status codes by name, for the `rpc.grpc.status_code` attribute.
_GRPC_CODES = {code.name: code.value[0] for code in grpc.StatusCode}
# Codes that are a fault of the server (the span is marked as an error).
_SERVER_FAULTS = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)

_propagator = TraceContextTextMapPropagator()
_tracer: trace.Tracer | None = None
_provider: TracerProvider | None = None


def enabled() -> bool:
    """True when spans are being recorded."""
    return _tracer is not None


def wanted(env: Mapping[str, str]) -> bool:
    """Whether the environment asks for tracing (see the module docstring)."""
    mode = env.get("RUNIFOLD_TRACING", "").strip().lower()
    if mode in {"off", "none", "0", "false"}:
        return False
    if mode == "otlp":
        return True
    if mode:
        raise ValueError(f"RUNIFOLD_TRACING must be otlp or off, got {mode!r}")
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def configure(service: str, env: Mapping[str, str]) -> bool:
    """Export spans over OTLP/gRPC when the environment asks for it; return whether on.

    The exporter reads the standard `OTEL_EXPORTER_OTLP_*` variables (endpoint,
    headers, certificates, timeout), the sampler reads `OTEL_TRACES_SAMPLER`
    (default: parent-based, always on) and the resource `OTEL_SERVICE_NAME` and
    `OTEL_RESOURCE_ATTRIBUTES`.
    """
    if not wanted(env):
        return False
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": f"runifold-{service}"})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    install(provider)
    log.info("tracing on: spans exported over OTLP")
    return True


def install(provider: TracerProvider) -> None:
    """Record spans with this provider (tests pass one with an in-memory exporter)."""
    global _tracer, _provider
    _provider = provider
    _tracer = provider.get_tracer("runifold")


def shutdown() -> None:
    """Flush pending spans and stop recording (idempotent)."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


class ServerSpan:
    """The span of one inbound RPC, current while the handler runs."""

    __slots__ = ("_token", "span")

    def __init__(self, span: trace.Span, token: object) -> None:
        self.span = span
        self._token = token

    def end(self, code: str) -> None:
        """Record the final status code and close the span."""
        span = self.span
        span.set_attribute("rpc.grpc.status_code", _GRPC_CODES.get(code, 2))
        if code in _SERVER_FAULTS:
            span.set_status(Status(StatusCode.ERROR, code))
        span.end()
        otel_context.detach(self._token)  # type: ignore[arg-type]


def start_server_span(method: str, context: Any, call_id: str) -> ServerSpan | None:
    """Open the span of an inbound RPC as a child of the caller's `traceparent`, if any.

    `context` is the RPC's ServicerContext; nothing of it is read while tracing is off.
    """
    tracer = _tracer
    if tracer is None:
        return None
    metadata: Iterable[tuple[str, Any]] = context.invocation_metadata() or ()
    carrier = {key: value for key, value in metadata if isinstance(value, str)}
    parent = _propagator.extract(carrier)
    service, _, name = method.lstrip("/").partition("/")
    span = tracer.start_span(
        method.lstrip("/"),
        context=parent,
        kind=SpanKind.SERVER,
        attributes={
            "rpc.system": "grpc",
            "rpc.service": service,
            "rpc.method": name,
            "runifold.call_id": call_id,
        },
    )
    token = otel_context.attach(trace.set_span_in_context(span, parent))
    trace_id_var.set(format(span.get_span_context().trace_id, "032x"))
    return ServerSpan(span, token)


def client_span(peer: str, stub_method: object) -> AbstractContextManager[None]:
    """A span around an outbound call to a peer service (a shared no-op when tracing is off)."""
    if _tracer is None:
        return _NO_SPAN
    return _client_span(_tracer, peer, stub_method)


_NO_SPAN: AbstractContextManager[None] = nullcontext()


@contextmanager
def _client_span(tracer: trace.Tracer, peer: str, stub_method: object) -> Iterator[None]:
    # A stub's multi-callable knows its "/package.Service/Method" path.
    path = getattr(stub_method, "_method", b"")
    method = (path.decode() if isinstance(path, bytes) else str(path)).lstrip("/")
    service, _, name = method.partition("/")
    with tracer.start_as_current_span(
        method or peer,
        kind=SpanKind.CLIENT,
        attributes={
            "rpc.system": "grpc",
            "rpc.service": service,
            "rpc.method": name,
            "runifold.peer": peer,
        },
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield
        except Exception as exc:
            code = getattr(exc, "code", None)
            label = getattr(code, "value", None) or type(exc).__name__
            span.set_status(Status(StatusCode.ERROR, str(label)))
            raise


def inject() -> tuple[tuple[str, str], ...]:
    """The `traceparent`/`tracestate` metadata of the current span (empty when off)."""
    if _tracer is None:
        return ()
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return tuple(carrier.items())
