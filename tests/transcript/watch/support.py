"""What the WatchConversation tests share: a stream read in the background, and checks of
what it delivered."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import grpc
import h2.config
import h2.connection
import h2.settings
from google.protobuf.message import Message

from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common.status import error_info
from tests.support.waiting import wait_for

if TYPE_CHECKING:
    from runifold.transcript.v1.transcript_service_pb2_grpc import TranscriptServiceAsyncStub

Metadata = Sequence[tuple[str, str]]


class Follower:
    """One WatchConversation stream, read in a background task: its events in order, and
    how it ended (`error`, or `ended` cleanly)."""

    def __init__(
        self,
        stub: TranscriptServiceAsyncStub,
        request: pb.WatchConversationRequest,
        metadata: Metadata = (),
    ) -> None:
        self.request = request
        self.call = stub.WatchConversation(request, metadata=metadata)
        self.events: list[pb.WatchConversationResponse] = []
        self.error: grpc.aio.AioRpcError | None = None
        self.ended = False
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for event in self.call:
                self.events.append(event)
        except grpc.aio.AioRpcError as error:
            self.error = error
        finally:
            self.ended = True

    def kinds(self) -> list[str]:
        """The kind of each event, in order."""
        return [str(event.WhichOneof("event")) for event in self.events]

    def of(self, kind: str) -> list[pb.WatchConversationResponse]:
        return [event for event in self.events if event.WhichOneof("event") == kind]

    def sequences(self) -> list[int]:
        """Every delivered entry's sequence, in delivery order."""
        return [e.sequence for event in self.of("appended") for e in event.appended.entries]

    def texts(self) -> list[str]:
        return [e.message.text for event in self.of("appended") for e in event.appended.entries]

    def heartbeats(self) -> list[pb.Heartbeat]:
        return [event.heartbeat for event in self.of("heartbeat")]

    def reason(self) -> str:
        """The ErrorInfo reason the stream failed with ("" when it did not fail)."""
        if self.error is None:
            return ""
        info = error_info(self.error)
        return info.reason if info is not None else "-"

    async def until(self, predicate: Callable[[Follower], bool], timeout: float = 20.0) -> None:
        """Wait until `predicate(self)` holds (failing with what arrived at the deadline)."""

        async def holds() -> bool:
            return predicate(self)

        try:
            await wait_for(holds, timeout=timeout, interval=0.01)
        except AssertionError:
            raise AssertionError(
                f"not reached; events {self.kinds()}, sequences {self.sequences()}, "
                f"ended {self.ended}, error {self.error!r}"
            ) from None

    async def until_sequence(self, last: int, timeout: float = 20.0) -> None:
        await self.until(lambda f: last in f.sequences() or f.ended, timeout)
        assert last in self.sequences(), (self.kinds(), self.error)

    async def until_ended(self, timeout: float = 20.0) -> None:
        await self.until(lambda f: f.ended, timeout)

    async def close(self) -> None:
        self.call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def __aenter__(self) -> Follower:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def caught_up(self) -> Follower:
        """Wait for the first heartbeat (the replay is done); the follower itself."""
        await self.until(lambda f: bool(f.heartbeats()))
        return self


def check_exactly_once_in_order(sequences: Sequence[int], after: int, last: int) -> None:
    """The sequences delivered are after+1 .. last, each once, in order."""
    assert list(sequences) == list(range(after + 1, last + 1)), (
        f"expected {after + 1}..{last} once each in order, got {list(sequences)}"
    )


def versions_of(follower: Follower) -> dict[int, tuple[int, int]]:
    """Per delivered sequence: (the version of its append, that append's last sequence)."""
    return {
        entry.sequence: (event.appended.version, event.appended.last_sequence)
        for event in follower.of("appended")
        for entry in event.appended.entries
    }


class UnreadStreams:
    """WatchConversation streams opened by a hostile HTTP/2 client that never reads: it
    grants the server the largest flow-control windows HTTP/2 allows (so flow control
    never stops the server), reads only the server's SETTINGS, and then nothing; its
    socket's receive buffer is small, so the server's writes soon stop at the socket.

    `close()` drops the connection (the server's calls end with it)."""

    PATH = "/runifold.transcript.v1.TranscriptService/WatchConversation"

    def __init__(self, address: str, requests: Sequence[Message], path: str = PATH) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1,
                h2.settings.SettingCodes.MAX_FRAME_SIZE: 2**24 - 1,
            },
        )
        conn.initiate_connection()
        conn.increment_flow_control_window(2**31 - 1 - 65535)
        for request in requests:
            body = request.SerializeToString()
            stream_id = conn.get_next_available_stream_id()
            conn.send_headers(
                stream_id,
                [
                    (":method", "POST"),
                    (":scheme", "http"),
                    (":path", path),
                    (":authority", address),
                    ("content-type", "application/grpc"),
                    ("te", "trailers"),
                ],
            )
            conn.send_data(stream_id, b"\0" + struct.pack(">I", len(body)) + body, end_stream=True)
        self.sock.sendall(conn.data_to_send())
        # The server's SETTINGS, acknowledged (it waits for that); then never read again.
        conn.receive_data(self.sock.recv(65536))
        self.sock.sendall(conn.data_to_send())

    def close(self) -> None:
        self.sock.close()
