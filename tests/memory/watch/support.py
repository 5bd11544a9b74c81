"""What the WatchMemories tests share: a stream read in the background, the writes whose
changes it must see, and checks of what it delivered."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import grpc

from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as pb
from runifold.transcript.v1 import transcript_service_pb2 as tpb
from services.common.status import error_info
from tests.support.waiting import wait_for

if TYPE_CHECKING:
    from runifold.memory.v1.memory_service_pb2_grpc import MemoryServiceAsyncStub
    from runifold.transcript.v1.transcript_service_pb2_grpc import TranscriptServiceAsyncStub

Metadata = Sequence[tuple[str, str]]

KINDS = {
    pb.MEMORY_EVENT_KIND_CREATED: "created",
    pb.MEMORY_EVENT_KIND_UPDATED: "updated",
    pb.MEMORY_EVENT_KIND_SUPERSEDED: "superseded",
    pb.MEMORY_EVENT_KIND_DELETED: "deleted",
    pb.MEMORY_EVENT_KIND_EXPIRED: "expired",
    pb.MEMORY_EVENT_KIND_ERASED: "erased",
}


class Watcher:
    """One WatchMemories stream, read in a background task: its events in order, and how
    it ended (`error`, or `ended` cleanly)."""

    def __init__(
        self,
        stub: MemoryServiceAsyncStub,
        request: pb.WatchMemoriesRequest,
        metadata: Metadata = (),
    ) -> None:
        self.request = request
        self.call = stub.WatchMemories(request, metadata=metadata)
        self.events: list[pb.WatchMemoriesResponse] = []
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

    def changes(self) -> list[pb.MemoryEvent]:
        """Every change delivered, in delivery order."""
        return [e.change for e in self.events if e.WhichOneof("event") == "change"]

    def sequences(self) -> list[int]:
        return [change.change_sequence for change in self.changes()]

    def heartbeats(self) -> list[pb.MemoryHeartbeat]:
        return [e.heartbeat for e in self.events if e.WhichOneof("event") == "heartbeat"]

    def kinds(self) -> list[tuple[str, str, int]]:
        """(memory id, kind, revision) of each change, in delivery order."""
        return [(c.memory_id, KINDS[c.kind], c.revision) for c in self.changes()]

    def reason(self) -> str:
        """The ErrorInfo reason the stream failed with ("" when it did not fail)."""
        if self.error is None:
            return ""
        info = error_info(self.error)
        return info.reason if info is not None else "-"

    async def until(self, predicate: Callable[[Watcher], bool], timeout: float = 30.0) -> None:
        """Wait until `predicate(self)` holds (failing with what arrived at the deadline)."""

        async def holds() -> bool:
            return predicate(self)

        try:
            await wait_for(holds, timeout=timeout, interval=0.01)
        except AssertionError:
            raise AssertionError(
                f"not reached; sequences {self.sequences()}, heartbeats "
                f"{len(self.heartbeats())}, ended {self.ended}, error {self.error!r}"
            ) from None

    async def until_sequence(self, last: int, timeout: float = 30.0) -> None:
        """Wait until change `last` arrived (or the stream ended: then fail)."""
        await self.until(lambda w: last in w.sequences() or w.ended, timeout)
        assert last in self.sequences(), (self.sequences(), self.error)

    async def until_ended(self, timeout: float = 30.0) -> None:
        await self.until(lambda w: w.ended, timeout)

    async def caught_up(self) -> Watcher:
        """Wait for the first heartbeat (the replay is done); the watcher itself."""
        await self.until(lambda w: bool(w.heartbeats()) or w.ended)
        assert self.heartbeats(), (self.error, self.sequences())
        return self

    async def close(self) -> None:
        self.call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task

    async def __aenter__(self) -> Watcher:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


def check_exactly_once_in_order(sequences: Sequence[int], after: int, last: int) -> None:
    """The change sequences delivered are after+1 .. last, each once, in order."""
    assert list(sequences) == list(range(after + 1, last + 1)), (
        f"expected {after + 1}..{last} once each in order, got {list(sequences)}"
    )


async def conversation(
    transcript: TranscriptServiceAsyncStub, namespace: str, entries: int = 4
) -> str:
    """A conversation of `entries` user messages, the source of the memories written."""
    created = await transcript.CreateConversation(
        tpb.CreateConversationRequest(namespace=namespace)
    )
    cid = created.conversation.conversation_id
    await transcript.AppendEntries(
        tpb.AppendEntriesRequest(
            namespace=namespace,
            conversation_id=cid,
            messages=[
                common_pb2.Message(role=common_pb2.ROLE_USER, text=f"message {i}")
                for i in range(entries)
            ],
        )
    )
    return cid


def source(cid: str, low: int = 1, high: int = 1) -> pb.MemorySource:
    return pb.MemorySource(conversation_id=cid, from_sequence=low, through_sequence=high)
