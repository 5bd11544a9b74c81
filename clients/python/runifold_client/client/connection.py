"""What every service's calls share: the channel of each event loop, the call with its
deadline and typed errors, and the one paging loop of the listings.

Every RPC of the four services is a method of `AsyncClient` (runifold_client.client),
composed of one class of methods per service on this connection. A call speaks to one
address (the all-in-one server, or a gateway in front of the services), has a
deadline, and is retried by gRPC itself (a service-config `retryPolicy`: UNAVAILABLE
only, exponential backoff, within the call's deadline) on every method but Summarize
and ProposeMemories, which would spend model calls again.

What a client is not given it reads from the environment the `runifold` command reads
(RUNIFOLD_TARGET, RUNIFOLD_NAMESPACE, RUNIFOLD_TOKEN), so one `export` moves every tool.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, Protocol, Self, TypeVar

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.agent.v1 import agent_service_pb2_grpc as agent_grpc
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.memory.v1 import memory_service_pb2_grpc as memory_grpc
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.summary.v1 import summary_service_pb2_grpc as summary_grpc
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold.transcript.v1 import transcript_service_pb2_grpc as transcript_grpc
from runifold_client.errors import RunifoldError, Unavailable, from_rpc_error

DEFAULT_TARGET = "127.0.0.1:50051"
# What a client reads when it is not given a target, a namespace or a token.
TARGET_ENV = "RUNIFOLD_TARGET"
NAMESPACE_ENV = "RUNIFOLD_NAMESPACE"
TOKEN_ENV = "RUNIFOLD_TOKEN"  # noqa: S105  # the variable's name, not a token
# Page size of the listing iterators (the servers allow at most 1000).
PAGE_SIZE = 500
Response = TypeVar("Response")
T = TypeVar("T")

# The methods a retry would spend model calls again for (nothing is stored twice either way).
_NOT_RETRIED = {
    ("runifold.summary.v1.SummaryService", "Summarize"),
    ("runifold.memory.v1.MemoryService", "ProposeMemories"),
}
_SERVICES = (
    agent_pb.DESCRIPTOR.services_by_name["AgentService"],
    transcript_pb.DESCRIPTOR.services_by_name["TranscriptService"],
    summary_pb.DESCRIPTOR.services_by_name["SummaryService"],
    memory_pb.DESCRIPTOR.services_by_name["MemoryService"],
)


def channel_options(max_attempts: int) -> list[tuple[str, Any]]:
    """gRPC channel options: its retry policy for every method but Summarize and ProposeMemories.

    gRPC retries only UNAVAILABLE (the call never reached a server, or a store was
    down), at most `max_attempts` (2..5) attempts in all, within the call's deadline.
    """
    if max_attempts < 2:
        return [("grpc.enable_retries", 0)]
    names = [
        {"service": service.full_name, "method": method.name}
        for service in _SERVICES
        for method in service.methods
        if (service.full_name, method.name) not in _NOT_RETRIED
    ]
    config = {
        "methodConfig": [
            {
                "name": names,
                "retryPolicy": {
                    "maxAttempts": min(max_attempts, 5),
                    "initialBackoff": "0.1s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
    return [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(config))]


def duration(seconds: float | timedelta | None) -> duration_pb2.Duration | None:
    """A Duration field from seconds (or a timedelta); None leaves the field unset."""
    if seconds is None:
        return None
    value = duration_pb2.Duration()
    value.FromTimedelta(seconds if isinstance(seconds, timedelta) else timedelta(seconds=seconds))
    return value


def timestamp(moment: datetime | None) -> timestamp_pb2.Timestamp | None:
    """A Timestamp field from a datetime; None leaves the field unset."""
    if moment is None:
        return None
    value = timestamp_pb2.Timestamp()
    value.FromDatetime(moment)
    return value


def from_environment(
    target: str | None, namespace: str | None, token: str | None
) -> tuple[str, str, str | None]:
    """The target, namespace and token of a client: what it is given, else the
    environment's RUNIFOLD_TARGET, RUNIFOLD_NAMESPACE, RUNIFOLD_TOKEN, else the defaults
    (127.0.0.1:50051, no namespace: the token's, no token). An empty string given is
    given: `namespace=""` leaves the namespace to the token, `token=""` sends none."""
    return (
        target or os.environ.get(TARGET_ENV) or DEFAULT_TARGET,
        os.environ.get(NAMESPACE_ENV, "") if namespace is None else namespace,
        (os.environ.get(TOKEN_ENV) or None) if token is None else token,
    )


def _metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


class Page(Protocol):
    """A listing's reply: its items in a repeated field, and the token of the next page."""

    @property
    def next_page_token(self) -> str: ...


PageT = TypeVar("PageT", bound=Page)


class _LoopChannel:
    """A channel of one event loop, and the stubs on it."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.transcripts = transcript_grpc.TranscriptServiceStub(channel)
        self.summaries = summary_grpc.SummaryServiceStub(channel)
        self.memories = memory_grpc.MemoryServiceStub(channel)
        self.agent = agent_grpc.AgentServiceStub(channel)


class Connection:
    """The channels of a client (one per event loop) and the calls on them.

    `target` is the server's host:port; `namespace` is the default of every call (each
    method takes `namespace=` too); `token` is sent as a bearer token. Each not given is
    read from RUNIFOLD_TARGET, RUNIFOLD_NAMESPACE, RUNIFOLD_TOKEN (`from_environment`).
    `timeout` (seconds) is each call's deadline unless the call says otherwise;
    `max_attempts` bounds gRPC's retries of UNAVAILABLE.
    It may be made outside any event loop and used from several (a channel per loop,
    opened on the loop's first call): threads, `asyncio.run` after `asyncio.run`.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        namespace: str | None = None,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float = 60.0,
        max_attempts: int = 3,
    ) -> None:
        self.target, self.namespace, token = from_environment(target, namespace, token)
        self.timeout = timeout
        self.max_attempts = max_attempts
        self._metadata = _metadata(token)
        self._credentials = credentials
        self._options = channel_options(max_attempts)
        # One channel per event loop, made on the loop's first call: a grpc.aio channel
        # belongs to the loop it was made on, and one client (a framework session built
        # outside any loop, say) is used from several: Runner.run_sync, threads, one
        # asyncio.run after another.
        self._lock = threading.Lock()
        self._channels: dict[asyncio.AbstractEventLoop, _LoopChannel] = {}
        self._closed = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def _here(self) -> _LoopChannel:
        """The channel (and stubs) of the running loop, made on its first call."""
        loop = asyncio.get_running_loop()
        found = self._channels.get(loop)
        if found is not None:
            return found
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed")
            found = self._channels.get(loop)
            if found is None:
                # A closed loop's channel can never run again: let it go.
                for gone in [other for other in self._channels if other.is_closed()]:
                    del self._channels[gone]
                channel = (
                    grpc.aio.secure_channel(self.target, self._credentials, options=self._options)
                    if self._credentials is not None
                    else grpc.aio.insecure_channel(self.target, options=self._options)
                )
                found = self._channels[loop] = _LoopChannel(channel)
            return found

    def for_caller(self, *, token: str | None, namespace: str = "") -> Self:
        """This client acting for another caller: its bearer token and default namespace,
        over the same channels (no connection is opened). For a server that calls
        Runifold on behalf of many callers (`runifold mcp` over HTTP); close the client
        it came from, never the view."""
        view = copy.copy(self)
        view._metadata = _metadata(token)
        view.namespace = namespace
        return view

    @property
    def channel(self) -> grpc.aio.Channel:
        """The channel of the running event loop."""
        return self._here().channel

    @property
    def transcripts(self) -> transcript_grpc.TranscriptServiceAsyncStub:
        return self._here().transcripts

    @property
    def summaries(self) -> summary_grpc.SummaryServiceAsyncStub:
        return self._here().summaries

    @property
    def memories(self) -> memory_grpc.MemoryServiceAsyncStub:
        return self._here().memories

    @property
    def agent(self) -> agent_grpc.AgentServiceAsyncStub:
        return self._here().agent

    async def close(self) -> None:
        """Close the channels: this loop's (awaited), each other running loop's on that
        loop; a channel of a closed loop is let go. A closed client makes no calls."""
        with self._lock:
            self._closed = True
            channels, self._channels = self._channels, {}
        here = asyncio.get_running_loop()
        for loop, open_channel in channels.items():
            if loop is here:
                await open_channel.channel.close()
            elif loop.is_running():
                asyncio.run_coroutine_threadsafe(open_channel.channel.close(), loop)

    def _ns(self, namespace: str | None) -> str:
        return self.namespace if namespace is None else namespace

    def _failure(self, error: grpc.aio.AioRpcError) -> RunifoldError:
        """The typed error of a failed call; one that never reached a Runifold server
        (UNAVAILABLE without an ErrorInfo: nothing listens there, the network, a port that
        does not speak gRPC) says where the client tried to connect."""
        failure = from_rpc_error(error)
        if isinstance(failure, Unavailable) and failure.reason == "UNAVAILABLE":
            return Unavailable.unreachable(failure, self.target)
        return failure

    async def _call(
        self,
        method: Callable[..., Awaitable[Response]],
        request: Any,
        timeout: float | None = None,
    ) -> Response:
        try:
            return await method(request, timeout=timeout or self.timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as error:
            raise self._failure(error) from None

    async def _pages(
        self,
        page: Callable[[str], Awaitable[PageT]],
        items: Callable[[PageT], Iterable[T]],
    ) -> AsyncIterator[T]:
        """Every item of a listing, page by page: `page(token)` calls for the page at a
        token ("" first), `items` are its items; the listing ends at a page with no next
        token. Nothing is called before the first item is asked for."""
        token = ""
        while True:
            reply = await page(token)
            for item in items(reply):
                yield item
            token = reply.next_page_token
            if not token:
                return
