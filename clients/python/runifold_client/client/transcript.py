"""TranscriptService's calls: conversations, their entries and state, views, watching,
and turn leases."""

from __future__ import annotations

import asyncio
import enum
import os
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import timedelta
from typing import Any

import grpc

from runifold.common.v1 import common_pb2
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client.client.connection import PAGE_SIZE, Connection, duration
from runifold_client.client.watch import Position, backoff_s, resumable
from runifold_client.digests import Verified, recompute
from runifold_client.policy import InputLike, messages


class TurnLeaseMode(enum.IntEnum):
    """How a turn lease shares the conversation (runifold.transcript.v1.TurnLeaseMode).

    SHARED: other turns may run; the first to append wins.
    EXCLUSIVE: the only running turn (ConversationBusy while another runs or waits).
    QUEUED: exclusive, waiting in line for the turns ahead of it.
    """

    SHARED = transcript_pb.TURN_LEASE_MODE_SHARED
    EXCLUSIVE = transcript_pb.TURN_LEASE_MODE_EXCLUSIVE
    QUEUED = transcript_pb.TURN_LEASE_MODE_QUEUED


def new_conversation_id() -> str:
    """A UUIDv7 (RFC 9562): time-ordered like the ids the server makes, and made here so
    that a retried CreateConversation names the same conversation."""
    millis = time.time_ns() // 1_000_000
    value = (millis & (2**48 - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122 variant
    return str(uuid.UUID(int=value))


class TranscriptCalls(Connection):
    """The methods of TranscriptService."""

    async def create_conversation(
        self,
        *,
        namespace: str | None = None,
        conversation_id: str = "",
        labels: Mapping[str, str] | None = None,
        user_id: str = "",
        state: transcript_pb.StateDelta | None = None,
    ) -> transcript_pb.Conversation:
        """Create (or get, when it exists) a conversation; its id is made here (a UUIDv7)
        when you pass none, so that a retry names the same conversation. `user_id` and
        the initial `state` apply only when this call creates it."""
        reply = await self.create_conversation_reply(
            namespace=namespace,
            conversation_id=conversation_id,
            labels=labels,
            user_id=user_id,
            state=state,
        )
        return reply.conversation

    async def create_conversation_reply(
        self,
        *,
        namespace: str | None = None,
        conversation_id: str = "",
        labels: Mapping[str, str] | None = None,
        user_id: str = "",
        state: transcript_pb.StateDelta | None = None,
    ) -> transcript_pb.CreateConversationResponse:
        """create_conversation's whole reply: the conversation and whether this call made it."""
        return await self._call(
            self.transcripts.CreateConversation,
            transcript_pb.CreateConversationRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id or new_conversation_id(),
                labels=labels,
                user_id=user_id,
                state=state,
            ),
        )

    async def get_state(
        self, user_ids: Sequence[str] = (), *, namespace: str | None = None
    ) -> transcript_pb.GetStateResponse:
        """The namespace's state and these users' (at most 100), without a conversation."""
        return await self._call(
            self.transcripts.GetState,
            transcript_pb.GetStateRequest(namespace=self._ns(namespace), user_ids=user_ids),
        )

    async def get_conversation(
        self, conversation_id: str, *, namespace: str | None = None
    ) -> transcript_pb.Conversation:
        """A conversation's version and counters."""
        reply = await self._call(
            self.transcripts.GetConversation,
            transcript_pb.GetConversationRequest(
                namespace=self._ns(namespace), conversation_id=conversation_id
            ),
        )
        return reply.conversation

    async def list_conversations(
        self,
        *,
        namespace: str | None = None,
        page_size: int = PAGE_SIZE,
        user_id: str = "",
        with_state: bool = False,
        newest_first: bool = False,
    ) -> AsyncIterator[transcript_pb.Conversation]:
        """Every conversation of a namespace (only a user's, with `user_id`), in id order
        (oldest first) or newest first, page by page, each with the preview of its first
        user message; with their state when asked (at most 50 a page)."""
        view = (
            transcript_pb.CONVERSATION_VIEW_FULL
            if with_state
            else transcript_pb.CONVERSATION_VIEW_BASIC
        )
        pages = self._pages(
            lambda token: self._call(
                self.transcripts.ListConversations,
                transcript_pb.ListConversationsRequest(
                    namespace=self._ns(namespace),
                    page_size=page_size,
                    page_token=token,
                    user_id=user_id,
                    view=view,
                    order=(
                        transcript_pb.CONVERSATION_ORDER_NEWEST_FIRST
                        if newest_first
                        else transcript_pb.CONVERSATION_ORDER_ID
                    ),
                ),
            ),
            lambda page: page.conversations,
        )
        async for item in pages:
            yield item

    async def list_namespaces(self, *, page_size: int = PAGE_SIZE) -> AsyncIterator[str]:
        """The namespaces that hold conversations among those the caller may read (its
        identity's grants; every one when the server has no authentication), in name
        order, page by page."""
        pages = self._pages(
            lambda token: self._call(
                self.transcripts.ListNamespaces,
                transcript_pb.ListNamespacesRequest(page_size=page_size, page_token=token),
            ),
            lambda page: page.namespaces,
        )
        async for item in pages:
            yield item

    async def append(
        self,
        conversation_id: str,
        input: InputLike,
        *,
        namespace: str | None = None,
        expected_version: int | None = None,
        request_id: str | None = None,
        usage: common_pb2.Usage | None = None,
        fencing_token: int | None = None,
        state_delta: transcript_pb.StateDelta | None = None,
        retract_sequences: Sequence[int] = (),
    ) -> transcript_pb.AppendEntriesResponse:
        """Append messages (compare-and-swap when expected_version is given; idempotent
        by `request_id`, made for you when you pass none), with state changes and
        retractions committed in the same write (`input` may then be empty)."""
        request = transcript_pb.AppendEntriesRequest(
            namespace=self._ns(namespace),
            conversation_id=conversation_id,
            messages=messages(input),
            request_id=request_id or str(uuid.uuid4()),
            usage=usage,
            state_delta=state_delta,
            retract_sequences=retract_sequences,
        )
        if expected_version is not None:
            request.expected_version = expected_version
        if fencing_token is not None:
            request.fencing_token = fencing_token
        return await self._call(self.transcripts.AppendEntries, request)

    async def fork_conversation(
        self,
        conversation_id: str,
        through_sequence: int,
        *,
        namespace: str | None = None,
        new_conversation_id: str = "",
        request_id: str | None = None,
    ) -> transcript_pb.Conversation:
        """A new conversation from the entries 1..through_sequence of this one, sharing
        them (edit and regenerate: fork before the message to edit, then run the turn on
        the fork). Idempotent by `request_id` (made for you when you pass none, so that a
        retried call makes one fork)."""
        reply = await self._call(
            self.transcripts.ForkConversation,
            transcript_pb.ForkConversationRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                through_sequence=through_sequence,
                new_conversation_id=new_conversation_id,
                request_id=request_id or str(uuid.uuid4()),
            ),
        )
        return reply.conversation

    async def list_forks(
        self, conversation_id: str, *, namespace: str | None = None, page_size: int = PAGE_SIZE
    ) -> list[transcript_pb.ForkRef]:
        """The conversation's forks and theirs, at any depth, in the order they were made
        (a fork before its own), each with its source and the last entry of it it
        shares: what erasing it erases with it. Reads every page of ListForks."""
        pages = self._pages(
            lambda token: self._call(
                self.transcripts.ListForks,
                transcript_pb.ListForksRequest(
                    namespace=self._ns(namespace),
                    conversation_id=conversation_id,
                    page_size=page_size,
                    page_token=token,
                ),
            ),
            lambda page: page.forks,
        )
        return [fork async for fork in pages]

    async def appends(
        self, conversation_id: str, *, namespace: str | None = None, after_version: int = 0
    ) -> AsyncIterator[transcript_pb.Append]:
        """Every append after a version, with its digest and the one it follows."""
        pages = self._pages(
            lambda token: self._call(
                self.transcripts.ListAppends,
                transcript_pb.ListAppendsRequest(
                    namespace=self._ns(namespace),
                    conversation_id=conversation_id,
                    after_version=after_version,
                    page_size=PAGE_SIZE,
                    page_token=token,
                ),
            ),
            lambda page: page.appends,
        )
        async for item in pages:
            yield item

    async def verify_conversation(
        self, conversation_id: str, *, namespace: str | None = None, head_digest: bytes = b""
    ) -> Verified:
        """Recompute the conversation's digest chain from its entries and appends and
        compare it with GetConversation's head digest, or find on it the `head_digest` you
        hold (an AppendEntries digest you kept: what you saw then is unchanged); raises
        VerificationFailed at the first append that was changed, removed or reordered."""
        conversation = await self.get_conversation(conversation_id, namespace=namespace)
        head = head_digest or conversation.head_digest
        through = conversation.version
        appends = [
            a
            async for a in self.appends(conversation_id, namespace=namespace)
            if a.version <= through
        ]
        last = appends[-1].last_sequence if appends else 0
        entries = {
            e.sequence: e
            async for e in self.entries(conversation_id, namespace=namespace, through_sequence=last)
            if e.sequence <= last
        }
        return recompute(appends, entries, head, held=bool(head_digest))

    async def entries(
        self,
        conversation_id: str,
        *,
        namespace: str | None = None,
        after_sequence: int = 0,
        through_sequence: int = 0,
    ) -> AsyncIterator[common_pb2.Entry]:
        """Every entry after a sequence (up to `through_sequence`, 0: the end), page by page."""
        pages = self._pages(
            lambda token: self._call(
                self.transcripts.ListEntries,
                transcript_pb.ListEntriesRequest(
                    namespace=self._ns(namespace),
                    conversation_id=conversation_id,
                    after_sequence=after_sequence,
                    through_sequence=through_sequence,
                    page_size=PAGE_SIZE,
                    page_token=token,
                ),
            ),
            lambda page: page.entries,
        )
        async for item in pages:
            yield item

    async def watch_conversation(
        self,
        conversation_id: str,
        *,
        namespace: str | None = None,
        after_sequence: int = 0,
        incarnation: int = 0,
        heartbeat_interval: float | timedelta | None = None,
        resume: bool = True,
        max_backoff: float = 5.0,
    ) -> AsyncIterator[transcript_pb.WatchConversationResponse]:
        """Follow a conversation (TranscriptService.WatchConversation): the entries after
        `after_sequence` (`appended` events, each entry once and in order), `retracted`
        for delivered entries a later write retracted, the turns that run on it
        (`turn_started`, `turn_finished`), `heartbeat`s while it is quiet, and a final
        `erased` (then the iteration ends). It has no deadline: stop iterating (or
        cancel) to leave.

        With `resume` (the default) a stream that breaks (UNAVAILABLE: a replica restarted
        or shut down, the network; RESOURCE_EXHAUSTED / WATCHER_TOO_SLOW: this reader fell
        behind) is watched again from the last sequence received and its incarnation, with
        backoff: nothing is missed and nothing repeats (a retraction the resumed stream
        reports again is dropped here). Turns still running are not
        reported started twice; a turn that finished while the stream was down is reported
        `turn_finished` with `TURN_FINISH_UNSPECIFIED` (how it ended is not known). Other
        errors are raised (NotFound, ResourceExhausted / WATCHER_LIMIT with its
        `retry_delay`, ...), and so is a first stream that reaches no server at all
        (`Unavailable` naming the address: a wrong target is said, not waited on).
        """
        position = Position(after_sequence, incarnation)
        reached = False  # whether a stream ever delivered an event
        while True:
            request = transcript_pb.WatchConversationRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                after_sequence=position.after,
                incarnation=position.known,
                heartbeat_interval=duration(heartbeat_interval),
            )
            call = self.transcripts.WatchConversation(request, metadata=self._metadata)
            try:
                async for received in call:
                    reached = True
                    for event in position.see(received):
                        yield event
                    if received.WhichOneof("event") == "erased":
                        return
                return
            except grpc.aio.AioRpcError as error:
                failure = self._failure(error)
                never_reached = not reached and failure.reason == "UNAVAILABLE"
                if not (resume and resumable(failure)) or never_reached:
                    raise failure from None
            finally:
                call.cancel()
            position.resumed()
            await asyncio.sleep(backoff_s(position.attempt, max_backoff))
            position.attempt += 1

    async def load_view(
        self,
        conversation_id: str,
        *,
        namespace: str | None = None,
        window: int = 16,
        summary_batch: int = 64,
        summarized_through: int = 0,
        request_id: str = "",
    ) -> transcript_pb.LoadViewResponse:
        """The bounded context of a turn: the recent window, the summary buffer, the backlog."""
        return await self._call(
            self.transcripts.LoadView,
            transcript_pb.LoadViewRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                window=window,
                summary_batch=summary_batch,
                summarized_through=summarized_through,
                request_id=request_id,
            ),
        )

    async def delete_conversation(
        self, conversation_id: str, *, namespace: str | None = None, incarnation: int = 0
    ) -> transcript_pb.DeleteConversationResponse:
        """Erase a transcript (only the transcript: see erase_conversation)."""
        return await self._call(
            self.transcripts.DeleteConversation,
            transcript_pb.DeleteConversationRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                incarnation=incarnation,
            ),
        )

    async def record_erasure_receipt(
        self,
        conversation_id: str,
        incarnation: int,
        counts: Mapping[str, int],
        remaining: Sequence[str] = (),
        *,
        namespace: str | None = None,
    ) -> transcript_pb.ErasureReceipt:
        """Record (or merge into) the receipt of an erasure of one incarnation of a
        conversation: what erase_conversation does for you; an application that erases its
        own way may report here too. Counts only grow, parts only leave `remaining`. Read
        receipts with erasure_receipt (AgentService's: it completes them)."""
        reply = await self._call(
            self.transcripts.RecordErasureReceipt,
            transcript_pb.RecordErasureReceiptRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                incarnation=incarnation,
                progress=transcript_pb.ErasureProgress(counts=counts, remaining=remaining),
            ),
        )
        return reply.receipt

    async def mark_curated(
        self,
        conversation_id: str,
        curated_through: int,
        *,
        incarnation: int = 0,
        namespace: str | None = None,
    ) -> transcript_pb.Conversation:
        """Record how far automatic curation read the conversation (its
        `curated_through`): monotonic, never past the last entry, only for `incarnation`
        (0: the current one). MemoryService's curation jobs call it; an application that
        curates its own way may too, so that AUTO curation starts after what it did."""
        reply = await self._call(
            self.transcripts.MarkCurated,
            transcript_pb.MarkCuratedRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                incarnation=incarnation,
                curated_through=curated_through,
            ),
        )
        return reply.conversation

    async def acquire_turn_lease(
        self,
        conversation_id: str,
        turn_id: str,
        *,
        namespace: str | None = None,
        mode: TurnLeaseMode = TurnLeaseMode.SHARED,
        ttl: float | timedelta | None = None,
        payload_hash: bytes = b"",
        create_if_missing: bool = False,
        timeout: float | None = None,
    ) -> transcript_pb.AcquireTurnLeaseResponse:
        """Take a turn lease before model work (`lease`), or learn that the turn already
        committed (`committed`) or ended (`ended`). `ttl` in seconds (server default 30)."""
        return await self._call(
            self.transcripts.AcquireTurnLease,
            transcript_pb.AcquireTurnLeaseRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                turn_id=turn_id,
                mode=int(mode),  # type: ignore[arg-type]
                ttl=duration(ttl),
                payload_hash=payload_hash,
                create_if_missing=create_if_missing,
            ),
            timeout,
        )

    async def renew_turn_lease(
        self,
        conversation_id: str,
        turn_id: str,
        fencing_token: int,
        *,
        namespace: str | None = None,
        ttl: float | timedelta | None = None,
    ) -> transcript_pb.TurnLease:
        """Extend a lease still held (TurnLeaseLost otherwise)."""
        reply = await self._call(
            self.transcripts.RenewTurnLease,
            transcript_pb.RenewTurnLeaseRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                turn_id=turn_id,
                fencing_token=fencing_token,
                ttl=duration(ttl),
            ),
        )
        return reply.lease

    async def release_turn_lease(
        self,
        conversation_id: str,
        turn_id: str,
        fencing_token: int,
        *,
        namespace: str | None = None,
        ended: transcript_pb.EndedTurn | None = None,
    ) -> bool:
        """End a turn that will not append (keeping its outcome when `ended` is given);
        False when the lease was no longer held."""
        reply = await self._call(
            self.transcripts.ReleaseTurnLease,
            transcript_pb.ReleaseTurnLeaseRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                turn_id=turn_id,
                fencing_token=fencing_token,
                ended=ended,
            ),
        )
        return reply.released

    async def put_checkpoint(
        self,
        conversation_id: str,
        checkpoint: transcript_pb.Checkpoint,
        *,
        namespace: str | None = None,
        run_id: str = "",
        turn_id: str = "",
        fencing_token: int | None = None,
    ) -> transcript_pb.PutCheckpointResponse:
        """Store a LangGraph checkpoint of the conversation (its thread) with the values of
        its channels whose version is new (`runifold_client.langgraph.RunifoldSaver` calls
        it). Fenced by a turn lease when `fencing_token` (and its `turn_id`) is given."""
        request = transcript_pb.PutCheckpointRequest(
            namespace=self._ns(namespace),
            conversation_id=conversation_id,
            checkpoint=checkpoint,
            run_id=run_id,
            turn_id=turn_id,
        )
        if fencing_token is not None:
            request.fencing_token = fencing_token
        return await self._call(self.transcripts.PutCheckpoint, request)

    async def put_checkpoint_writes(
        self,
        conversation_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        writes: Sequence[transcript_pb.CheckpointWrite],
        *,
        namespace: str | None = None,
        turn_id: str = "",
        fencing_token: int | None = None,
    ) -> int:
        """Store one task's pending writes against a checkpoint; how many were stored."""
        request = transcript_pb.PutCheckpointWritesRequest(
            namespace=self._ns(namespace),
            conversation_id=conversation_id,
            checkpoint_ns=checkpoint_ns,
            checkpoint_id=checkpoint_id,
            writes=writes,
            turn_id=turn_id,
        )
        if fencing_token is not None:
            request.fencing_token = fencing_token
        reply = await self._call(self.transcripts.PutCheckpointWrites, request)
        return reply.stored

    async def get_checkpoint(
        self,
        conversation_id: str,
        *,
        checkpoint_ns: str = "",
        checkpoint_id: str = "",
        namespace: str | None = None,
    ) -> transcript_pb.Checkpoint | None:
        """A checkpoint with its values and pending writes (the newest of `checkpoint_ns`
        without `checkpoint_id`); None when there is none."""
        reply = await self._call(
            self.transcripts.GetCheckpoint,
            transcript_pb.GetCheckpointRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                checkpoint_ns=checkpoint_ns,
                checkpoint_id=checkpoint_id,
            ),
        )
        return reply.checkpoint if reply.HasField("checkpoint") else None

    async def list_checkpoints(
        self,
        conversation_id: str,
        *,
        checkpoint_ns: str | None = None,
        filter_json: str = "",
        before_checkpoint_id: str = "",
        namespace: str | None = None,
        page_size: int = 0,
    ) -> AsyncIterator[transcript_pb.Checkpoint]:
        """The conversation's checkpoints, newest first (every checkpoint_ns unless one is
        given), filtered by metadata containment and `before_checkpoint_id`."""
        ns = self._ns(namespace)

        def page(token: str) -> Any:
            request = transcript_pb.ListCheckpointsRequest(
                namespace=ns,
                conversation_id=conversation_id,
                filter_json=filter_json,
                before_checkpoint_id=before_checkpoint_id,
                page_size=page_size,
                page_token=token,
            )
            if checkpoint_ns is not None:
                request.checkpoint_ns = checkpoint_ns
            return self._call(self.transcripts.ListCheckpoints, request)

        async for item in self._pages(page, lambda reply: reply.checkpoints):
            yield item

    async def delete_checkpoints(
        self,
        *,
        run_ids: Sequence[str] = (),
        conversation_ids: Sequence[str] = (),
        keep_latest: bool = False,
        namespace: str | None = None,
    ) -> transcript_pb.DeleteCheckpointsResponse:
        """Delete the checkpoints of runs (anywhere in the namespace) or of conversations
        (all, or all but the newest of each checkpoint_ns with `keep_latest`). Not an
        erasure: erase_conversation erases a thread with everything else."""
        return await self._call(
            self.transcripts.DeleteCheckpoints,
            transcript_pb.DeleteCheckpointsRequest(
                namespace=self._ns(namespace),
                run_ids=run_ids,
                conversation_ids=conversation_ids,
                keep_latest=keep_latest,
            ),
        )

    async def copy_checkpoints(
        self, conversation_id: str, target_conversation_id: str, *, namespace: str | None = None
    ) -> int:
        """Copy every checkpoint of a conversation into another (which must exist: a fork
        of it); how many were copied."""
        reply = await self._call(
            self.transcripts.CopyCheckpoints,
            transcript_pb.CopyCheckpointsRequest(
                namespace=self._ns(namespace),
                conversation_id=conversation_id,
                target_conversation_id=target_conversation_id,
            ),
        )
        return reply.checkpoints_copied
