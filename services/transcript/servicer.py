"""TranscriptService on the wire: protobuf <-> domain conversion only.

Errors are DomainErrors raised by the domain; the shared interceptor maps
them to status codes with ErrorInfo.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from runifold.transcript.v1 import transcript_service_pb2 as pb
from runifold.transcript.v1 import transcript_service_pb2_grpc as pb_grpc
from services.common import convert
from services.common import messages as message_rules
from services.common.auth import ALL, identity_var
from services.common.watch import servicer as watch_wire
from services.transcript import metrics as transcript_metrics
from services.transcript.checkpoints.model import (
    ChannelValue,
    CheckpointWrite,
    StoredCheckpoint,
    TypedValue,
    too_many_values,
)
from services.transcript.conversations.model import AppendRecord, Conversation, ScopedState
from services.transcript.leases.model import EndedTurn, TurnLease
from services.transcript.receipts.model import ErasureProgress, ErasureReceipt
from services.transcript.service import TranscriptService
from services.transcript.watch import model as events
from services.transcript.watch.model import watcher_too_slow
from services.transcript.watch.service import Feed

Context = Any  # grpc.aio.ServicerContext; only WatchConversation writes through it


def conversation_to_proto(conversation: Conversation) -> pb.Conversation:
    """The wire form of a conversation."""
    return pb.Conversation(
        conversation_id=str(conversation.conversation_id),
        namespace=conversation.namespace,
        version=conversation.version,
        last_sequence=conversation.last_sequence,
        create_time=convert.timestamp(conversation.create_time),
        update_time=convert.timestamp(conversation.update_time),
        labels=dict(conversation.labels),
        incarnation=conversation.incarnation,
        user_id=conversation.user_id or "",
        state_json=conversation.state_json,
        curated_through=conversation.curated_through,
        preview=conversation.preview,
        fork_origin=pb.ForkOrigin(
            conversation_id=str(conversation.fork_origin.conversation_id),
            through_sequence=conversation.fork_origin.through_sequence,
        )
        if conversation.fork_origin is not None
        else None,
        head_digest=conversation.head_digest,
    )


def receipt_to_proto(receipt: ErasureReceipt) -> pb.ErasureReceipt:
    """The wire form of an erasure receipt."""
    return pb.ErasureReceipt(
        receipt_id=str(receipt.receipt_id),
        conversation_id=str(receipt.conversation_id),
        namespace=receipt.namespace,
        incarnation=receipt.incarnation,
        counts=dict(receipt.counts),
        remaining=list(receipt.remaining),
        create_time=convert.timestamp(receipt.create_time),
        complete_time=convert.timestamp(receipt.complete_time),
    )


def scoped_state_to_proto(state: ScopedState) -> pb.ScopedState:
    """The wire form of a namespace's or a user's state."""
    return pb.ScopedState(
        user_id=state.user_id,
        state_json=state.state_json,
        version=state.version,
        update_time=convert.timestamp(state.update_time),
    )


def append_record_to_proto(record: AppendRecord) -> pb.AppendRecord:
    """The wire form of a committed append."""
    return pb.AppendRecord(
        version=record.version,
        first_sequence=record.first_sequence,
        last_sequence=record.last_sequence,
        usage=convert.usage_to_proto(record.usage),
        commit_time=convert.timestamp(record.commit_time),
    )


def lease_to_proto(lease: TurnLease) -> pb.TurnLease:
    """The wire form of a turn lease."""
    return pb.TurnLease(
        conversation_id=str(lease.conversation_id),
        fencing_token=lease.fencing_token,
        expire_time=convert.timestamp(lease.expire_time),
        exclusive=lease.exclusive,
        created=lease.created,
    )


def ended_to_proto(ended: EndedTurn) -> pb.EndedTurn:
    """The wire form of a turn that ended without committing."""
    return pb.EndedTurn(
        output=[convert.message_to_proto(m) for m in ended.output],
        usage=convert.usage_to_proto(ended.usage),
        reason=ended.reason,
        metadata=dict(ended.metadata),
        end_time=convert.timestamp(ended.end_time) if ended.end_time else None,
    )


def ended_from_proto(ended: pb.EndedTurn) -> EndedTurn:
    """An ended turn as the caller reports it (its messages are kept as sent)."""
    return EndedTurn(
        output=tuple(convert.messages_from_proto(ended.output, "ended.output")),
        usage=convert.usage_from_proto(ended.usage),
        reason=ended.reason,
        metadata=dict(ended.metadata),
    )


def watch_event_to_proto(event: events.WatchEvent) -> pb.WatchConversationResponse:
    """The wire form of one WatchConversation event."""
    if isinstance(event, events.Appended):
        appended = pb.Appended(
            version=event.version,
            last_sequence=event.last_sequence,
            incarnation=event.incarnation,
        )
        convert.add_entries(appended.entries, event.entries)
        return pb.WatchConversationResponse(appended=appended)
    if isinstance(event, events.Retracted):
        return pb.WatchConversationResponse(
            retracted=pb.Retracted(
                version=event.version,
                sequences=event.sequences,
                retract_time=convert.timestamp(event.retract_time),
            )
        )
    if isinstance(event, events.Heartbeat):
        return pb.WatchConversationResponse(
            heartbeat=pb.Heartbeat(
                version=event.version,
                last_sequence=event.last_sequence,
                incarnation=event.incarnation,
                read_time=convert.timestamp(event.read_time),
            )
        )
    if isinstance(event, events.TurnStarted):
        return pb.WatchConversationResponse(
            turn_started=pb.TurnStarted(
                turn_id=event.turn_id,
                start_time=convert.timestamp(event.start_time),
                exclusive=event.exclusive,
            )
        )
    if isinstance(event, events.TurnFinished):
        return pb.WatchConversationResponse(
            turn_finished=pb.TurnFinished(
                turn_id=event.turn_id,
                finish=int(event.finish),  # type: ignore[arg-type]  # values equal TurnFinish's
                version=event.version,
                reason=event.reason,
            )
        )
    return pb.WatchConversationResponse(erased=pb.Erased(incarnation=event.incarnation))


def typed_to_proto(value: TypedValue) -> pb.TypedValue:
    """The wire form of a serialized value."""
    return pb.TypedValue(type=value.type, value=value.value or b"")


def write_to_proto(write: CheckpointWrite) -> pb.CheckpointWrite:
    """The wire form of a pending write."""
    return pb.CheckpointWrite(
        task_id=write.task_id,
        idx=write.idx,
        channel=write.channel,
        value=typed_to_proto(write.value),
        task_path=write.task_path,
    )


def write_from_proto(write: pb.CheckpointWrite) -> CheckpointWrite:
    """A pending write as the caller sent it (its bytes verbatim)."""
    return CheckpointWrite(
        write.task_id,
        write.idx,
        write.channel,
        TypedValue(write.value.type, write.value.value),
        write.task_path,
    )


def checkpoint_to_proto(checkpoint: StoredCheckpoint) -> pb.Checkpoint:
    """The wire form of a checkpoint with its values and pending writes."""
    return pb.Checkpoint(
        checkpoint_ns=checkpoint.checkpoint_ns,
        checkpoint_id=checkpoint.checkpoint_id,
        parent_checkpoint_id=checkpoint.parent_checkpoint_id or "",
        checkpoint=typed_to_proto(checkpoint.checkpoint),
        metadata_json=checkpoint.metadata_json,
        channel_versions=checkpoint.channel_versions,
        channel_values=[
            pb.ChannelValue(
                channel=value.channel, version=value.version, value=typed_to_proto(value.value)
            )
            for value in checkpoint.channel_values
        ],
        pending_writes=[write_to_proto(write) for write in checkpoint.pending_writes],
        create_time=convert.timestamp(checkpoint.create_time),
    )


def checkpoint_from_proto(checkpoint: pb.Checkpoint) -> StoredCheckpoint:
    """A checkpoint as PutCheckpoint sends it (its bytes verbatim; no writes)."""
    return StoredCheckpoint(
        checkpoint_ns=checkpoint.checkpoint_ns,
        checkpoint_id=checkpoint.checkpoint_id,
        parent_checkpoint_id=checkpoint.parent_checkpoint_id or None,
        checkpoint=TypedValue(checkpoint.checkpoint.type, checkpoint.checkpoint.value),
        metadata_json=checkpoint.metadata_json,
        channel_versions=dict(checkpoint.channel_versions),
        channel_values=tuple(
            ChannelValue(
                value.channel, value.version, TypedValue(value.value.type, value.value.value)
            )
            for value in checkpoint.channel_values
        ),
        pending_writes=(),
        create_time=datetime.now(UTC),
    )


class TranscriptServicer(pb_grpc.TranscriptServiceServicer):
    """gRPC adapter of the transcript domain service."""

    def __init__(self, service: TranscriptService, feed: Feed) -> None:
        self.service = service
        self.feed = feed

    async def CreateConversation(
        self, request: pb.CreateConversationRequest, context: Context
    ) -> pb.CreateConversationResponse:
        state = self.service.state_change(
            request.state.conversation_json,
            request.state.user_json,
            request.state.namespace_json,
            "state",
        )
        conversation, created = await self.service.create_conversation(
            request.namespace, request.conversation_id, dict(request.labels), request.user_id, state
        )
        return pb.CreateConversationResponse(
            conversation=conversation_to_proto(conversation), created=created
        )

    async def GetConversation(
        self, request: pb.GetConversationRequest, context: Context
    ) -> pb.GetConversationResponse:
        conversation = await self.service.get_conversation(
            request.namespace, request.conversation_id
        )
        return pb.GetConversationResponse(conversation=conversation_to_proto(conversation))

    async def AppendEntries(
        self, request: pb.AppendEntriesRequest, context: Context
    ) -> pb.AppendEntriesResponse:
        # The count before the conversion: an oversized append costs no more than this.
        message_rules.message_count(
            len(request.messages), self.service.limits.max_messages_per_append, "messages"
        )
        result = await self.service.append(
            request.namespace,
            request.conversation_id,
            request.expected_version if request.HasField("expected_version") else None,
            convert.messages_from_proto(request.messages, "messages"),
            request.request_id,
            convert.usage_from_proto(request.usage),
            request.fencing_token if request.HasField("fencing_token") else None,
            self.service.state_change(
                request.state_delta.conversation_json,
                request.state_delta.user_json,
                request.state_delta.namespace_json,
                "state_delta",
            ),
            list(request.retract_sequences),
        )
        self.service.leases.appended(request.namespace, request.conversation_id)
        record = result.record
        return pb.AppendEntriesResponse(
            version=record.version,
            first_sequence=record.first_sequence,
            last_sequence=record.last_sequence,
            replayed=result.replayed,
            usage=convert.usage_to_proto(record.usage),
            user_state_version=result.user_state_version,
            namespace_state_version=result.namespace_state_version,
            digest=record.digest,
        )

    async def ListEntries(
        self, request: pb.ListEntriesRequest, context: Context
    ) -> pb.ListEntriesResponse:
        page = await self.service.list_entries(
            request.namespace,
            request.conversation_id,
            request.after_sequence,
            request.through_sequence,
            request.page_size,
            request.page_token,
            request.retracted_after_version,
        )
        response = pb.ListEntriesResponse(next_page_token=page.next_page_token)
        convert.add_entries(response.entries, page.entries)
        return response

    async def LoadView(self, request: pb.LoadViewRequest, context: Context) -> pb.LoadViewResponse:
        view = await self.service.load_view(
            request.namespace,
            request.conversation_id,
            request.window,
            request.summary_batch,
            request.summarized_through,
            request.request_id,
        )
        response = pb.LoadViewResponse(
            version=view.version,
            last_sequence=view.last_sequence,
            summary_backlog=view.summary_backlog,
            prior_append=append_record_to_proto(view.prior_append) if view.prior_append else None,
            incarnation=view.incarnation,
            conversation=conversation_to_proto(view.conversation) if view.conversation else None,
        )
        convert.add_entries(response.window, view.window)
        convert.add_entries(response.summary_buffer, view.summary_buffer)
        return response

    async def ListConversations(
        self, request: pb.ListConversationsRequest, context: Context
    ) -> pb.ListConversationsResponse:
        page = await self.service.list_conversations(
            request.namespace,
            request.page_size,
            request.page_token,
            request.user_id,
            request.view == pb.CONVERSATION_VIEW_FULL,
            int(request.order),
        )
        return pb.ListConversationsResponse(
            conversations=[conversation_to_proto(c) for c in page.conversations],
            next_page_token=page.next_page_token,
        )

    async def ListNamespaces(
        self, request: pb.ListNamespacesRequest, context: Context
    ) -> pb.ListNamespacesResponse:
        # The caller's grants, as the guard authenticated them (no identity: auth off).
        identity = identity_var.get()
        granted = None if identity is None or ALL in identity.namespaces else identity.namespaces
        page = await self.service.list_namespaces(request.page_size, request.page_token, granted)
        return pb.ListNamespacesResponse(
            namespaces=page.namespaces, next_page_token=page.next_page_token
        )

    async def DeleteConversation(
        self, request: pb.DeleteConversationRequest, context: Context
    ) -> pb.DeleteConversationResponse:
        deleted = await self.service.delete_conversation(
            request.namespace,
            request.conversation_id,
            request.incarnation,
            ErasureProgress(dict(request.receipt.counts), list(request.receipt.remaining))
            if request.HasField("receipt")
            else None,
            [(fork.conversation_id, fork.incarnation) for fork in request.erased_forks.forks]
            if request.HasField("erased_forks")
            else None,
        )
        return pb.DeleteConversationResponse(
            deleted=deleted.deleted,
            entries_deleted=deleted.entries,
            appends_deleted=deleted.appends,
            receipt=receipt_to_proto(deleted.receipt) if deleted.receipt else None,
        )

    async def RecordErasureReceipt(
        self, request: pb.RecordErasureReceiptRequest, context: Context
    ) -> pb.RecordErasureReceiptResponse:
        receipt = await self.service.record_receipt(
            request.namespace,
            request.conversation_id,
            request.incarnation,
            dict(request.progress.counts),
            list(request.progress.remaining),
        )
        return pb.RecordErasureReceiptResponse(receipt=receipt_to_proto(receipt))

    async def GetErasureReceipt(
        self, request: pb.GetErasureReceiptRequest, context: Context
    ) -> pb.GetErasureReceiptResponse:
        receipt = await self.service.get_receipt(
            request.namespace, request.receipt_id, request.conversation_id
        )
        return pb.GetErasureReceiptResponse(receipt=receipt_to_proto(receipt))

    async def GetState(self, request: pb.GetStateRequest, context: Context) -> pb.GetStateResponse:
        states = await self.service.get_state(request.namespace, list(request.user_ids))
        return pb.GetStateResponse(
            namespace_state=scoped_state_to_proto(states[0]),
            user_states=[scoped_state_to_proto(s) for s in states[1:]],
        )

    async def AcquireTurnLease(
        self, request: pb.AcquireTurnLeaseRequest, context: Context
    ) -> pb.AcquireTurnLeaseResponse:
        outcome = await self.service.leases.acquire_turn_lease(
            request.namespace,
            request.conversation_id,
            request.turn_id,
            int(request.mode),
            convert.timedelta_from_request(request.ttl, "ttl", "INVALID_LEASE_TTL").total_seconds(),
            request.payload_hash,
            request.create_if_missing,
        )
        if isinstance(outcome, TurnLease):
            return pb.AcquireTurnLeaseResponse(lease=lease_to_proto(outcome))
        if isinstance(outcome, EndedTurn):
            return pb.AcquireTurnLeaseResponse(ended=ended_to_proto(outcome))
        return pb.AcquireTurnLeaseResponse(committed=append_record_to_proto(outcome))

    async def RenewTurnLease(
        self, request: pb.RenewTurnLeaseRequest, context: Context
    ) -> pb.RenewTurnLeaseResponse:
        lease = await self.service.leases.renew_turn_lease(
            request.namespace,
            request.conversation_id,
            request.turn_id,
            request.fencing_token,
            convert.timedelta_from_request(request.ttl, "ttl", "INVALID_LEASE_TTL").total_seconds(),
            request.calling_model,
        )
        return pb.RenewTurnLeaseResponse(lease=lease_to_proto(lease))

    async def ReleaseTurnLease(
        self, request: pb.ReleaseTurnLeaseRequest, context: Context
    ) -> pb.ReleaseTurnLeaseResponse:
        released = await self.service.leases.release_turn_lease(
            request.namespace,
            request.conversation_id,
            request.turn_id,
            request.fencing_token,
            ended_from_proto(request.ended) if request.HasField("ended") else None,
            request.model_call_failed,
        )
        return pb.ReleaseTurnLeaseResponse(released=released)

    async def ForkConversation(
        self, request: pb.ForkConversationRequest, context: Context
    ) -> pb.ForkConversationResponse:
        conversation, created = await self.service.fork_conversation(
            request.namespace,
            request.conversation_id,
            request.through_sequence,
            request.new_conversation_id,
            request.request_id,
        )
        return pb.ForkConversationResponse(
            conversation=conversation_to_proto(conversation), created=created
        )

    async def ListAppends(
        self, request: pb.ListAppendsRequest, context: Context
    ) -> pb.ListAppendsResponse:
        page = await self.service.list_appends(
            request.namespace,
            request.conversation_id,
            request.after_version,
            request.page_size,
            request.page_token,
        )
        return pb.ListAppendsResponse(
            appends=[
                pb.Append(
                    version=link.version,
                    first_sequence=link.first_sequence,
                    last_sequence=link.last_sequence,
                    digest=link.digest,
                    previous_digest=link.previous_digest,
                    commit_time=convert.timestamp(link.commit_time),
                    retracted_sequences=link.retracted_sequences,
                )
                for link in page.appends
            ],
            next_page_token=page.next_page_token,
        )

    async def ListForks(
        self, request: pb.ListForksRequest, context: Context
    ) -> pb.ListForksResponse:
        page = await self.service.list_forks(
            request.namespace, request.conversation_id, request.page_size, request.page_token
        )
        return pb.ListForksResponse(
            forks=[
                pb.ForkRef(
                    conversation_id=str(fork.conversation_id),
                    incarnation=fork.incarnation,
                    source_conversation_id=str(fork.source_id),
                    through_sequence=fork.through_sequence,
                )
                for fork in page.forks
            ],
            next_page_token=page.next_page_token,
        )

    # A coroutine that writes through the context (grpc.aio serves both forms), so that
    # each write can time out; the stubs know only the generator form.
    async def WatchConversation(  # type: ignore[override]
        self, request: pb.WatchConversationRequest, context: Context
    ) -> None:
        stream = self.feed.watch(
            request.namespace,
            request.conversation_id,
            request.after_sequence,
            request.incarnation,
            watch_wire.heartbeat_s(request),
            # What the stream holds is given back when the call has ended: a cut stream's
            # last event stays in the transport until then.
            until_done=lambda release: context.add_done_callback(lambda _: release()),
        )
        await watch_wire.write_stream(
            context,
            stream,
            watch_event_to_proto,
            self.feed.limits.send_timeout_s,
            watcher_too_slow,
            transcript_metrics.WATCH_STREAMS_CUT,
        )

    async def MarkCurated(
        self, request: pb.MarkCuratedRequest, context: Context
    ) -> pb.MarkCuratedResponse:
        conversation = await self.service.mark_curated(
            request.namespace, request.conversation_id, request.incarnation, request.curated_through
        )
        return pb.MarkCuratedResponse(conversation=conversation_to_proto(conversation))

    async def PutCheckpoint(
        self, request: pb.PutCheckpointRequest, context: Context
    ) -> pb.PutCheckpointResponse:
        # The count before the conversion: an oversized put costs no more than this.
        limit = self.service.limits.checkpoints.max_values_per_call
        if len(request.checkpoint.channel_values) > limit:
            raise too_many_values("checkpoint.channel_values", limit)
        stored = await self.service.put_checkpoint(
            request.namespace,
            request.conversation_id,
            checkpoint_from_proto(request.checkpoint),
            request.run_id,
            request.turn_id,
            request.fencing_token if request.HasField("fencing_token") else None,
        )
        return pb.PutCheckpointResponse(
            checkpoint_id=request.checkpoint.checkpoint_id, channel_values_stored=stored
        )

    async def PutCheckpointWrites(
        self, request: pb.PutCheckpointWritesRequest, context: Context
    ) -> pb.PutCheckpointWritesResponse:
        limit = self.service.limits.checkpoints.max_values_per_call
        if len(request.writes) > limit:
            raise too_many_values("writes", limit)
        stored = await self.service.put_checkpoint_writes(
            request.namespace,
            request.conversation_id,
            request.checkpoint_ns,
            request.checkpoint_id,
            [write_from_proto(write) for write in request.writes],
            request.turn_id,
            request.fencing_token if request.HasField("fencing_token") else None,
        )
        return pb.PutCheckpointWritesResponse(stored=stored)

    async def GetCheckpoint(
        self, request: pb.GetCheckpointRequest, context: Context
    ) -> pb.GetCheckpointResponse:
        found = await self.service.get_checkpoint(
            request.namespace, request.conversation_id, request.checkpoint_ns, request.checkpoint_id
        )
        return pb.GetCheckpointResponse(
            checkpoint=checkpoint_to_proto(found) if found is not None else None
        )

    async def ListCheckpoints(
        self, request: pb.ListCheckpointsRequest, context: Context
    ) -> pb.ListCheckpointsResponse:
        page = await self.service.list_checkpoints(
            request.namespace,
            request.conversation_id,
            request.checkpoint_ns if request.HasField("checkpoint_ns") else None,
            request.filter_json,
            request.before_checkpoint_id,
            request.page_size,
            request.page_token,
        )
        return pb.ListCheckpointsResponse(
            checkpoints=[checkpoint_to_proto(checkpoint) for checkpoint in page.checkpoints],
            next_page_token=page.next_page_token,
        )

    async def DeleteCheckpoints(
        self, request: pb.DeleteCheckpointsRequest, context: Context
    ) -> pb.DeleteCheckpointsResponse:
        deleted = await self.service.delete_checkpoints(
            request.namespace,
            list(request.run_ids),
            list(request.conversation_ids),
            request.keep_latest,
        )
        return pb.DeleteCheckpointsResponse(
            checkpoints_deleted=deleted.checkpoints,
            channel_values_deleted=deleted.channel_values,
            writes_deleted=deleted.writes,
        )

    async def CopyCheckpoints(
        self, request: pb.CopyCheckpointsRequest, context: Context
    ) -> pb.CopyCheckpointsResponse:
        copied = await self.service.copy_checkpoints(
            request.namespace, request.conversation_id, request.target_conversation_id
        )
        return pb.CopyCheckpointsResponse(checkpoints_copied=copied)
