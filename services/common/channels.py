"""Channels to the other services, and the calls made over them, with deadlines and
error mapping.

Every outbound call has a deadline: the smaller of the peer timeout and what
is left of the inbound RPC's deadline (the interceptor records it). A peer's
failure becomes a DomainError that keeps the peer's code and ErrorInfo
reason, except that an unreachable peer is UNAVAILABLE / STORE_UNAVAILABLE
naming the peer, and a spent deadline is DEADLINE_EXCEEDED.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from services.common import tracing
from services.common.auth import AuthSettings, channel_credentials, outbound_identity_metadata
from services.common.deadlines import DEFAULT_PEER_TIMEOUT_S, deadline_var, remaining
from services.common.errors import Code, DomainError, StoreUnavailable
from services.common.logs import CALL_ID_HEADER, call_id_var
from services.common.status import from_rpc_error

Response = TypeVar("Response")

__all__ = ["DEFAULT_PEER_TIMEOUT_S", "Peer", "deadline_var", "open_channel", "remaining"]
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.enable_retries", 0),
]


class _Carry(grpc.aio.UnaryUnaryClientInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    """Adds one metadata pair to every call of a channel."""

    def __init__(self, pair: tuple[str, str]) -> None:
        self.pair = pair

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), self.pair)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


def open_channel(address: str, auth: AuthSettings | None = None) -> grpc.aio.Channel:
    """A channel to a peer service: TLS (with our client certificate for mutual TLS)
    when configured, plaintext otherwise. A channel from an all-in-one server to its
    own address carries the server's internal credential (and no other does)."""
    credentials = channel_credentials(auth) if auth is not None else None
    internal = auth.internal if auth is not None else None
    interceptors = (
        [_Carry(internal.metadata())]
        if internal is not None and internal.address == address
        else None
    )
    if credentials is None:
        return grpc.aio.insecure_channel(
            address, options=_CHANNEL_OPTIONS, interceptors=interceptors
        )
    options: list[tuple[str, int | str]] = list(_CHANNEL_OPTIONS)
    if auth is not None and auth.tls_server_name:
        options.append(("grpc.ssl_target_name_override", auth.tls_server_name))
    return grpc.aio.secure_channel(address, credentials, options=options, interceptors=interceptors)


class Peer:
    """One peer service: its name (for errors and metrics) and its channel."""

    def __init__(
        self, name: str, channel: grpc.aio.Channel, timeout: float = DEFAULT_PEER_TIMEOUT_S
    ) -> None:
        self.name = name
        self.channel = channel
        self.timeout = timeout

    async def call(
        self,
        method: Callable[..., Awaitable[Response]],
        request: Any,
        *,
        seconds: float | None = None,
    ) -> Response:
        """Invoke a stub method under the propagated deadline, mapping failures."""
        budget = remaining(self.timeout if seconds is None else seconds)
        with tracing.client_span(self.name, method):
            try:
                return await method(request, timeout=budget, metadata=outbound_metadata())
            except grpc.aio.AioRpcError as error:
                raise peer_error(self.name, error) from None

    async def close(self) -> None:
        """Close the channel."""
        await self.channel.close()


def outbound_metadata() -> tuple[tuple[str, str], ...]:
    """Metadata carried to peers: the call id, the caller's identity (so that every
    service enforces the same namespace rule), and the trace context when tracing is
    on (W3C `traceparent`)."""
    call_id = call_id_var.get()
    carried: tuple[tuple[str, str], ...] = ((CALL_ID_HEADER, call_id),) if call_id else ()
    carried += outbound_identity_metadata()
    return carried + tracing.inject() if tracing.enabled() else carried


def peer_error(name: str, error: grpc.aio.AioRpcError) -> DomainError:
    """The domain error of a failed peer call."""
    code = error.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        return StoreUnavailable(name, f"the {name} service is unavailable; retry later")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DomainError(
            Code.DEADLINE_EXCEEDED,
            "DEADLINE_EXCEEDED",
            f"the {name} service did not answer before the deadline",
        )
    if code == grpc.StatusCode.CANCELLED:
        return DomainError(Code.CANCELLED, "CANCELLED", "the request was cancelled")
    mapped = from_rpc_error(error)
    if mapped.code is Code.INTERNAL:
        return DomainError(Code.INTERNAL, "INTERNAL", f"the {name} service failed")
    if mapped.reason.startswith("UPSTREAM_"):  # the peer sent no ErrorInfo
        return DomainError(mapped.code, mapped.reason, f"the {name} service failed")
    return mapped
