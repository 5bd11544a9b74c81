"""A change feed's stream on the wire, shared by WatchConversation
(services/transcript/servicer.py) and WatchMemories (services/memory/servicer.py): the
heartbeat interval a request asks for, and the loop that writes the stream's events with
flow control (a reader that takes nothing for the send timeout is cut off, and holds
back only its own stream).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from typing import Any, Literal, Protocol, TypeVar

from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from prometheus_client import Counter

from services.common import convert
from services.common.errors import DomainError, StreamStalled

E = TypeVar("E")


class WatchRequest(Protocol):
    """A request that may ask for a heartbeat interval."""

    @property
    def heartbeat_interval(self) -> Duration: ...

    def HasField(self, field_name: Literal["heartbeat_interval"]) -> bool: ...


def heartbeat_s(request: WatchRequest) -> float:
    """The heartbeat interval a request asks for, in seconds (0: none asked)."""
    if not request.HasField("heartbeat_interval"):
        return 0.0
    return convert.timedelta_from_request(
        request.heartbeat_interval, "heartbeat_interval", "INVALID_HEARTBEAT_INTERVAL"
    ).total_seconds()


async def write_stream(
    context: Any,  # grpc.aio.ServicerContext
    events: AsyncGenerator[E],
    to_proto: Callable[[E], Message],
    send_timeout_s: float,
    too_slow: Callable[[float], DomainError],
    streams_cut: Counter,
) -> None:
    """Write each event of `events` through `context`, each write waiting for the
    transport; count the streams the server ends in `streams_cut` (by reason)."""
    try:
        async for event in events:
            # Serialized here and the event let go, so that a write that waits holds the
            # message once (and grpc's copy), not also what the event carries and its
            # protobuf; and the message let go once written, before the stream waits
            # for more.
            message = to_proto(event).SerializeToString()
            del event
            # Each write waits for the transport (HTTP/2 flow control): the stream reads
            # its next page only once the reader took this event. A reader that takes
            # nothing for the timeout is cut off; it resumes from where it was.
            try:
                async with asyncio.timeout(send_timeout_s):
                    await context.write(message)
            except TimeoutError:
                streams_cut.labels("WATCHER_TOO_SLOW").inc()
                raise StreamStalled(too_slow(send_timeout_s)) from None
            del message
    except DomainError as error:
        if error.reason == "SERVER_SHUTTING_DOWN":
            streams_cut.labels("SERVER_SHUTTING_DOWN").inc()
        raise
    finally:
        await events.aclose()
