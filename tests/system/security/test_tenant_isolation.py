"""Tenant isolation: tenant A's credentials on tenant B's resources, for every RPC.

JWT authentication is on: A's token grants only namespace A, B's only B. For
every RPC of every service (enumerated from the descriptors: an RPC without a
case fails here) each probe is asked

(a) with namespace B: PERMISSION_DENIED / NAMESPACE_NOT_GRANTED, exactly as
    for a namespace nobody uses, and still so when every other field is
    garbage (authorization comes before validation, so nothing is read);
(b) with namespace A and B's ids and page tokens: exactly the outcome (status,
    reason, message, metadata; or the reply) of the same request with ids
    that never existed, so B's existence is not revealed.

Each is asked over gRPC and, in a second run, over the HTTP port (Connect JSON), where
the refusals of (a) must also be word for word those of gRPC.

Afterwards every row B holds in every service table is unchanged, its
searches find the same memories, and nothing A received, nor any prompt the
model saw while A called, contains B's namespace or any of B's text.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.common.http.bridge import GRPC_ONLY
from tests.support.fake_openai import FakeOpenAI
from tests.support.grpc_calls import user
from tests.support.stack import Stack
from tests.support.waiting import wait_for
from tests.system.security.support import (
    RPC_BY_ID,
    RPCS,
    Metadata,
    Outcome,
    Rpc,
    bearer,
    invoke,
    invoke_http,
    must,
    namespace_rows,
)
from tests.system.security.worlds import (
    World,
    build_world,
    checkpoint_of,
    indexed_search_ids,
    search_ids,
)

# --- what a probe points at --------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """The ids a probe uses: B's real ones, or ones that never existed."""

    conversation_id: str
    memory_id: str
    memory_revision: int
    version: int
    last_sequence: int
    summary_through: int
    request_id: str
    turn_id: str
    conversations_token: str
    entries_token: str
    memories_token: str
    query: str
    ids: tuple[str, ...] = field(default=())
    erased_conversation_id: str = ""
    erased_incarnation: int = 0
    receipt_id: str = ""
    checkpoint_id: str = ""


def target_of(world: World) -> Target:
    return Target(
        conversation_id=world.conversation_id,
        memory_id=world.memory_ids[0],
        memory_revision=world.memory_revision,
        version=world.version,
        last_sequence=world.last_sequence,
        summary_through=world.summary_through,
        request_id=world.request_id,
        turn_id=world.turn_id,
        conversations_token=world.conversations_token,
        entries_token=world.entries_token,
        memories_token=world.memories_token,
        query=world.memory_content,
        ids=(
            world.conversation_id,
            world.memory_ids[0],
            world.request_id,
            world.turn_id,
            world.erased_conversation_id,
            world.receipt_id,
        ),
        erased_conversation_id=world.erased_conversation_id,
        erased_incarnation=world.erased_incarnation,
        receipt_id=world.receipt_id,
        checkpoint_id=f"checkpoint-{world.marker}",
    )


def _forged_token(kind: str) -> str:
    """A token of the right shape that no server signed."""
    body = json.dumps({"k": kind, "c": {"after": str(uuid.uuid4())}}).encode()
    return base64.urlsafe_b64encode(os.urandom(16) + body).decode().rstrip("=")


def never_existed(like: Target) -> Target:
    """The same request fields, pointing at nothing (fresh ids, forged tokens)."""
    conversation_id, memory_id = str(uuid.uuid4()), str(uuid.uuid4())
    request_id, turn_id = f"append-{uuid.uuid4().hex}", f"turn-{uuid.uuid4().hex}"
    erased_id, receipt_id = str(uuid.uuid4()), str(uuid.uuid4())
    return replace(
        like,
        checkpoint_id=f"checkpoint-{uuid.uuid4().hex}",
        conversation_id=conversation_id,
        memory_id=memory_id,
        request_id=request_id,
        turn_id=turn_id,
        conversations_token=_forged_token("conversations"),
        entries_token=_forged_token("entries"),
        memories_token=_forged_token("memories"),
        ids=(conversation_id, memory_id, request_id, turn_id, erased_id, receipt_id),
        erased_conversation_id=erased_id,
        receipt_id=receipt_id,
    )


GARBAGE = Target(
    conversation_id="not-a-uuid",
    memory_id="\u202enot-a-uuid",
    memory_revision=-1,
    version=-(2**63),
    last_sequence=2**63 - 1,
    summary_through=-1,
    request_id="\x00",
    turn_id="",
    conversations_token="%%%",
    entries_token="\x00",
    memories_token="",
    query="",
    erased_conversation_id="\x00",
    erased_incarnation=-1,
    receipt_id="not-a-receipt",
)


# --- the cases: one per RPC ---------------------------------------------------------

# A probe builds a request for a namespace and a target; `own` is the caller's
# own world (A), for the fields that must name A's resources (memory sources).
Probe = Callable[[str, Target, World], Message]


@dataclass(frozen=True)
class Case:
    """The probes of one RPC (probes that create something in A come last)."""

    probes: tuple[Probe, ...]
    # What (b) may answer: a read or write of an id unknown in A.
    allowed: frozenset[str] = frozenset({"OK", "NOT_FOUND", "INVALID_ARGUMENT"})
    # An RPC that names no namespace (ListNamespaces): its answer is filtered by the
    # caller's grants instead, so (a) and (b) become: A's call answers A's namespace and
    # nothing of B's (the check of everything received, below, looks for B's name).
    unscoped: bool = False


def _turn(cls: type[Any], create: bool = False) -> Probe:
    def probe(ns: str, t: Target, own: World) -> Message:
        return cls(  # type: ignore[no-any-return]
            namespace=ns,
            conversation_id=t.conversation_id,
            input=[user("what do you know about the invoices?")],
            turn_id=t.turn_id,
            policy=agent_pb.ContextPolicy(memory_limit=4, window=4),
            create_if_missing=create,
        )

    return probe


CASES: dict[str, Case] = {
    "TranscriptService.CreateConversation": Case(
        (
            lambda ns, t, own: transcript_pb.CreateConversationRequest(
                namespace=ns, conversation_id=t.conversation_id
            ),
        )
    ),
    "TranscriptService.GetConversation": Case(
        (
            lambda ns, t, own: transcript_pb.GetConversationRequest(
                namespace=ns, conversation_id=t.conversation_id
            ),
        )
    ),
    "TranscriptService.AppendEntries": Case(
        (
            # A replay of B's append: same id, version and request id.
            lambda ns, t, own: transcript_pb.AppendEntriesRequest(
                namespace=ns,
                conversation_id=t.conversation_id,
                expected_version=t.version,
                messages=[user("injected")],
                request_id=t.request_id,
            ),
            lambda ns, t, own: transcript_pb.AppendEntriesRequest(
                namespace=ns, conversation_id=t.conversation_id, messages=[user("injected")]
            ),
        )
    ),
    "TranscriptService.ListEntries": Case(
        (
            lambda ns, t, own: transcript_pb.ListEntriesRequest(
                namespace=ns, conversation_id=t.conversation_id
            ),
            lambda ns, t, own: transcript_pb.ListEntriesRequest(
                namespace=ns,
                conversation_id=t.conversation_id,
                page_size=2,
                page_token=t.entries_token,
            ),
        )
    ),
    "TranscriptService.LoadView": Case(
        (
            lambda ns, t, own: transcript_pb.LoadViewRequest(
                namespace=ns,
                conversation_id=t.conversation_id,
                window=2,
                summary_batch=2,
                request_id=t.turn_id,
            ),
        )
    ),
    "TranscriptService.ListConversations": Case(
        (
            lambda ns, t, own: transcript_pb.ListConversationsRequest(namespace=ns),
            lambda ns, t, own: transcript_pb.ListConversationsRequest(
                namespace=ns, page_size=1, page_token=t.conversations_token
            ),
        )
    ),
    "TranscriptService.DeleteConversation": Case(
        (
            lambda ns, t, own: transcript_pb.DeleteConversationRequest(
                namespace=ns, conversation_id=t.conversation_id
            ),
        )
    ),
    "TranscriptService.ListNamespaces": Case(
        (
            lambda ns, t, own: transcript_pb.ListNamespacesRequest(),
            lambda ns, t, own: transcript_pb.ListNamespacesRequest(page_size=1),
        ),
        unscoped=True,
    ),
    "TranscriptService.GetState": Case(
        (
            # The user B's conversation belongs to: A sees its own (empty) state of it.
            lambda ns, t, own: transcript_pb.GetStateRequest(namespace=ns, user_ids=["owner"]),
        )
    ),
    "TranscriptService.AcquireTurnLease": Case(
        (
            # B's conversation and B's turn id: neither B's lease nor its outcome.
            lambda ns, t, own: transcript_pb.AcquireTurnLeaseRequest(
                namespace=ns,
                conversation_id=t.conversation_id,
                turn_id=t.turn_id,
                mode=transcript_pb.TURN_LEASE_MODE_EXCLUSIVE,
            ),
            # Creates a conversation of that id in A (last: it writes).
            lambda ns, t, own: transcript_pb.AcquireTurnLeaseRequest(
                namespace=ns,
                conversation_id=t.conversation_id,
                turn_id=t.turn_id,
                create_if_missing=True,
            ),
        )
    ),
    "TranscriptService.RenewTurnLease": Case(
        (
            lambda ns, t, own: transcript_pb.RenewTurnLeaseRequest(
                namespace=ns, conversation_id=t.conversation_id, turn_id=t.turn_id, fencing_token=1
            ),
        ),
        allowed=frozenset({"ABORTED", "INVALID_ARGUMENT"}),
    ),
    "TranscriptService.ReleaseTurnLease": Case(
        (
            lambda ns, t, own: transcript_pb.ReleaseTurnLeaseRequest(
                namespace=ns, conversation_id=t.conversation_id, turn_id=t.turn_id, fencing_token=1
            ),
        )
    ),
    "TranscriptService.WatchConversation": Case(
        (
            # B's conversation, from the start and from B's last sequence: not one event.
            lambda ns, t, own: transcript_pb.WatchConversationRequest(
                namespace=ns, conversation_id=t.conversation_id
            ),
            lambda ns, t, own: transcript_pb.WatchConversationRequest(
                namespace=ns, conversation_id=t.conversation_id, after_sequence=t.last_sequence
            ),
        ),
        allowed=frozenset({"NOT_FOUND", "INVALID_ARGUMENT"}),
    ),
    "SummaryService.GetSummary": Case(
        (
            lambda ns, t, own: summary_pb.GetSummaryRequest(
                namespace=ns, conversation_id=t.conversation_id
            ),
        )
    ),
    "SummaryService.CommitSummary": Case(
        (
            lambda ns, t, own: summary_pb.CommitSummaryRequest(
                namespace=ns,
                conversation_id=t.conversation_id,
                text="overwritten",
                through_sequence=t.last_sequence,
                expected_through_sequence=t.summary_through,
            ),
            lambda ns, t, own: summary_pb.CommitSummaryRequest(
                namespace=ns,
                conversation_id=t.conversation_id,
                text="overwritten",
                through_sequence=1,
            ),
        )
    ),
    "SummaryService.Summarize": Case(
        (
            lambda ns, t, own: summary_pb.SummarizeRequest(
                namespace=ns, conversation_id=t.conversation_id, window=1, summary_batch=2
            ),
        )
    ),
    "SummaryService.RequestSummary": Case(
        (
            lambda ns, t, own: summary_pb.RequestSummaryRequest(
                namespace=ns, conversation_id=t.conversation_id, window=1, summary_batch=2
            ),
        )
    ),
    "SummaryService.EraseSummaries": Case(
        (
            lambda ns, t, own: summary_pb.EraseSummariesRequest(
                namespace=ns, conversation_id=t.conversation_id
            ),
        ),
        allowed=frozenset({"OK", "NOT_FOUND"}),
    ),
    "SummaryService.GetBacklog": Case(
        (lambda ns, t, own: summary_pb.GetBacklogRequest(namespace=ns),)
    ),
    "MemoryService.UpsertMemory": Case(
        (
            # Replace B's memory at its revision.
            lambda ns, t, own: memory_pb.UpsertMemoryRequest(
                namespace=ns,
                memory_id=t.memory_id,
                expected_revision=t.memory_revision,
                content="overwritten",
                sources=[
                    memory_pb.MemorySource(
                        conversation_id=own.conversation_id, from_sequence=1, through_sequence=1
                    )
                ],
            ),
            # A memory derived from B's transcript.
            lambda ns, t, own: memory_pb.UpsertMemoryRequest(
                namespace=ns,
                content="derived",
                sources=[
                    memory_pb.MemorySource(
                        conversation_id=t.conversation_id, from_sequence=1, through_sequence=1
                    )
                ],
            ),
            # A memory of A superseding B's memory.
            lambda ns, t, own: memory_pb.UpsertMemoryRequest(
                namespace=ns,
                content="supersedes",
                sources=[
                    memory_pb.MemorySource(
                        conversation_id=own.conversation_id, from_sequence=1, through_sequence=1
                    )
                ],
                supersedes=[
                    memory_pb.SupersededMemory(
                        memory_id=t.memory_id, expected_revision=t.memory_revision
                    )
                ],
            ),
            # Create under B's memory id (creates A's own memory of that id).
            lambda ns, t, own: memory_pb.UpsertMemoryRequest(
                namespace=ns,
                memory_id=t.memory_id,
                content="a memory of A",
                sources=[
                    memory_pb.MemorySource(
                        conversation_id=own.conversation_id, from_sequence=1, through_sequence=1
                    )
                ],
            ),
        )
    ),
    "MemoryService.GetMemory": Case(
        (lambda ns, t, own: memory_pb.GetMemoryRequest(namespace=ns, memory_id=t.memory_id),)
    ),
    "MemoryService.ListMemories": Case(
        (
            lambda ns, t, own: memory_pb.ListMemoriesRequest(
                namespace=ns, conversation_id=t.conversation_id
            ),
            lambda ns, t, own: memory_pb.ListMemoriesRequest(
                namespace=ns, page_size=1, page_token=t.memories_token
            ),
            # B's memories' metadata, listed from A's namespace (RunifoldStore lists so).
            lambda ns, t, own: memory_pb.ListMemoriesRequest(
                namespace=ns, metadata_filter={"owner": t.query}
            ),
        )
    ),
    "MemoryService.SearchMemories": Case(
        (
            lambda ns, t, own: memory_pb.SearchMemoriesRequest(
                namespace=ns, query=t.query, limit=16
            ),
            lambda ns, t, own: memory_pb.SearchMemoriesRequest(
                namespace=ns, query=t.query, limit=16, metadata_filter={"owner": t.query}
            ),
        )
    ),
    "MemoryService.DeleteMemory": Case(
        (
            lambda ns, t, own: memory_pb.DeleteMemoryRequest(
                namespace=ns, memory_id=t.memory_id, expected_revision=t.memory_revision
            ),
            lambda ns, t, own: memory_pb.DeleteMemoryRequest(namespace=ns, memory_id=t.memory_id),
        )
    ),
    "MemoryService.ForgetSource": Case(
        (
            lambda ns, t, own: memory_pb.ForgetSourceRequest(
                namespace=ns, conversation_id=t.conversation_id, from_sequence=1, through_sequence=2
            ),
            lambda ns, t, own: memory_pb.ForgetSourceRequest(
                namespace=ns, conversation_id=t.conversation_id
            ),
        )
    ),
    "MemoryService.ListMemoryRevisions": Case(
        (
            lambda ns, t, own: memory_pb.ListMemoryRevisionsRequest(
                namespace=ns, memory_id=t.memory_id
            ),
            lambda ns, t, own: memory_pb.ListMemoryRevisionsRequest(
                namespace=ns, memory_id=t.memory_id, page_size=1
            ),
        )
    ),
    "MemoryService.ProposeMemories": Case(
        (
            lambda ns, t, own: memory_pb.ProposeMemoriesRequest(
                namespace=ns,
                conversation_id=t.conversation_id,
                from_sequence=1,
                through_sequence=t.last_sequence,
            ),
            lambda ns, t, own: memory_pb.ProposeMemoriesRequest(
                namespace=ns, conversation_id=t.conversation_id, from_sequence=1, through_sequence=1
            ),
        )
    ),
    "AgentService.RunConversation": Case(
        (_turn(agent_pb.RunConversationRequest), _turn(agent_pb.RunConversationRequest, True))
    ),
    "AgentService.StreamConversation": Case(
        (
            _turn(agent_pb.StreamConversationRequest),
            _turn(agent_pb.StreamConversationRequest, True),
        )
    ),
    # Erasing an id unknown in A is idempotent: it reports nothing erased (or NOT_FOUND).
    "AgentService.EraseConversation": Case(
        (
            lambda ns, t, own: agent_pb.EraseConversationRequest(
                namespace=ns, conversation_id=t.conversation_id
            ),
        ),
        allowed=frozenset({"OK", "NOT_FOUND"}),
    ),
    # B's erasure receipt, by id and by its erased conversation: in A, as for an id that
    # never existed (ERASURE_RECEIPT_NOT_FOUND).
    "AgentService.GetErasureReceipt": Case(
        (
            lambda ns, t, own: agent_pb.GetErasureReceiptRequest(
                namespace=ns, receipt_id=t.receipt_id
            ),
            lambda ns, t, own: agent_pb.GetErasureReceiptRequest(
                namespace=ns, conversation_id=t.erased_conversation_id
            ),
        )
    ),
    # B's conversation's forks, from A: none (as for an id that never existed).
    # Forking B's conversation from A, or reading its chain of appends: as for a
    # conversation that never existed (the fork comes last: it would create in A).
    "TranscriptService.ListAppends": Case(
        (
            lambda ns, t, own: transcript_pb.ListAppendsRequest(
                namespace=ns, conversation_id=t.conversation_id
            ),
            lambda ns, t, own: transcript_pb.ListAppendsRequest(
                namespace=ns, conversation_id=t.conversation_id, page_token=t.entries_token
            ),
        )
    ),
    "TranscriptService.ForkConversation": Case(
        (
            lambda ns, t, own: transcript_pb.ForkConversationRequest(
                namespace=ns,
                conversation_id=t.conversation_id,
                through_sequence=1,
                request_id=t.request_id,
            ),
        )
    ),
    # B's LangGraph checkpoints from A, by B's conversation id, checkpoint id and run
    # id: as for a thread that never existed (nothing read, nothing deleted; a put or a
    # copy finds no conversation).
    "TranscriptService.GetCheckpoint": Case(
        (
            lambda ns, t, own: transcript_pb.GetCheckpointRequest(
                namespace=ns, conversation_id=t.conversation_id
            ),
            lambda ns, t, own: transcript_pb.GetCheckpointRequest(
                namespace=ns,
                conversation_id=t.conversation_id,
                checkpoint_id=t.checkpoint_id,
            ),
        )
    ),
    "TranscriptService.ListCheckpoints": Case(
        (
            lambda ns, t, own: transcript_pb.ListCheckpointsRequest(
                namespace=ns, conversation_id=t.conversation_id
            ),
            lambda ns, t, own: transcript_pb.ListCheckpointsRequest(
                namespace=ns,
                conversation_id=t.conversation_id,
                filter_json='{"source": "loop"}',
                before_checkpoint_id=t.checkpoint_id,
            ),
        )
    ),
    "TranscriptService.DeleteCheckpoints": Case(
        (
            lambda ns, t, own: transcript_pb.DeleteCheckpointsRequest(
                namespace=ns, run_ids=[t.request_id]
            ),
            lambda ns, t, own: transcript_pb.DeleteCheckpointsRequest(
                namespace=ns, conversation_ids=[t.conversation_id]
            ),
            lambda ns, t, own: transcript_pb.DeleteCheckpointsRequest(
                namespace=ns, conversation_ids=[t.conversation_id], keep_latest=True
            ),
        )
    ),
    "TranscriptService.CopyCheckpoints": Case(
        (
            lambda ns, t, own: transcript_pb.CopyCheckpointsRequest(
                namespace=ns,
                conversation_id=t.conversation_id,
                target_conversation_id=own.conversation_id,
            ),
            lambda ns, t, own: transcript_pb.CopyCheckpointsRequest(
                namespace=ns,
                conversation_id=own.conversation_id,
                target_conversation_id=t.conversation_id,
            ),
        )
    ),
    "TranscriptService.PutCheckpoint": Case(
        (
            lambda ns, t, own: transcript_pb.PutCheckpointRequest(
                namespace=ns,
                conversation_id=t.conversation_id,
                checkpoint=checkpoint_of("injected"),
                run_id=t.request_id,
            ),
        )
    ),
    "TranscriptService.PutCheckpointWrites": Case(
        (
            lambda ns, t, own: transcript_pb.PutCheckpointWritesRequest(
                namespace=ns,
                conversation_id=t.conversation_id,
                checkpoint_id="checkpoint-injected",
                writes=[
                    transcript_pb.CheckpointWrite(
                        task_id="task-injected",
                        channel="messages",
                        value=transcript_pb.TypedValue(type="json", value=b'"injected"'),
                    )
                ],
            ),
        )
    ),
    "TranscriptService.ListForks": Case(
        (
            lambda ns, t, own: transcript_pb.ListForksRequest(
                namespace=ns, conversation_id=t.conversation_id
            ),
        )
    ),
    "TranscriptService.GetErasureReceipt": Case(
        (
            lambda ns, t, own: transcript_pb.GetErasureReceiptRequest(
                namespace=ns, receipt_id=t.receipt_id
            ),
            lambda ns, t, own: transcript_pb.GetErasureReceiptRequest(
                namespace=ns, conversation_id=t.erased_conversation_id
            ),
        )
    ),
    # Merging into B's receipt from A: A has no such conversation nor receipt, so nothing
    # is made (CONVERSATION_NOT_FOUND), as for an id that never existed.
    "TranscriptService.RecordErasureReceipt": Case(
        (
            lambda ns, t, own: transcript_pb.RecordErasureReceiptRequest(
                namespace=ns,
                conversation_id=t.erased_conversation_id,
                incarnation=t.erased_incarnation,
                progress=transcript_pb.ErasureProgress(counts={"entries": 99}),
            ),
            lambda ns, t, own: transcript_pb.RecordErasureReceiptRequest(
                namespace=ns,
                conversation_id=t.conversation_id,
                incarnation=max(t.erased_incarnation, 1),
                progress=transcript_pb.ErasureProgress(remaining=["transcript"]),
            ),
        )
    ),
    # Curation: B's conversation, in A, as one that never existed; A's backlog, never B's.
    "MemoryService.RequestCuration": Case(
        (
            lambda ns, t, own: memory_pb.RequestCurationRequest(
                namespace=ns, conversation_id=t.conversation_id
            ),
        )
    ),
    "MemoryService.GetCurationBacklog": Case(
        (lambda ns, t, own: memory_pb.GetCurationBacklogRequest(namespace=ns),)
    ),
    "TranscriptService.MarkCurated": Case(
        (
            lambda ns, t, own: transcript_pb.MarkCuratedRequest(
                namespace=ns, conversation_id=t.conversation_id, curated_through=1
            ),
        )
    ),
    # The feed of A's memories: A's changes, then a heartbeat; never one of B's.
    "MemoryService.WatchMemories": Case(
        (
            lambda ns, t, own: memory_pb.WatchMemoriesRequest(
                namespace=ns, heartbeat_interval=Duration(seconds=1)
            ),
        ),
        allowed=frozenset({"OK"}),
    ),
    "MemoryService.GetMemoryErasure": Case(
        (
            lambda ns, t, own: memory_pb.GetMemoryErasureRequest(
                namespace=ns,
                conversation_id=t.erased_conversation_id,
                incarnation=t.erased_incarnation,
            ),
        )
    ),
}

# --- comparing outcomes -----------------------------------------------------------

_VOLATILE_KEYS = {
    "create_time",
    "update_time",
    "commit_time",
    "created_at",
    "expire_time",
    "job_id",
    "read_time",  # a feed's heartbeat: when the server last looked
    # Opaque per creation and per grant (random, so they tell nothing either).
    "incarnation",
    "fencing_token",
}


def _scrub(value: Any, ids: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _scrub(v, ids) for k, v in value.items() if k not in _VOLATILE_KEYS}
    if isinstance(value, list):
        return [_scrub(v, ids) for v in value]
    if isinstance(value, str):
        for real, placeholder in ids.items():
            value = value.replace(real, placeholder)
        return value
    return value


def normalized(outcome: Outcome, target: Target) -> Any:
    """The outcome with the target's own ids (echoed back) and timestamps taken out."""
    ids = {real: f"<id{i}>" for i, real in enumerate(target.ids) if real}
    if outcome.ok:
        return (
            "OK",
            [
                _scrub(MessageToDict(r, preserving_proto_field_name=True), ids)
                for r in outcome.replies
                if not _waited(r)
            ],
        )
    return (
        outcome.code.name,
        outcome.reason,
        _scrub(outcome.details, ids),
        _scrub(dict(outcome.error_metadata), ids),
    )


def _waited(reply: Message) -> bool:
    """A turn's TURN_STAGE_WAITING progress: sent when its lease took over 100 ms, a
    fact about the machine's load that differs between any two calls, not about data."""
    return (
        isinstance(reply, agent_pb.StreamConversationResponse)
        and reply.HasField("progress")
        and reply.progress.stage == agent_pb.TURN_STAGE_WAITING
    )


def _text(outcome: Outcome) -> str:
    parts = [outcome.details, json.dumps(dict(outcome.error_metadata))]
    parts += [json.dumps(MessageToDict(r)) for r in outcome.replies]
    return "\n".join(parts)


# --- fixtures ------------------------------------------------------------------------


@dataclass
class Tenants:
    a: World
    b: World

    def nobody(self) -> str:
        return f"tenant-nobody-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def tenants(stack: Stack) -> Tenants:
    """B with something of every kind; A with a conversation of its own."""
    suffix = uuid.uuid4().hex[:10]
    a_ns, b_ns = f"tenant-a-{suffix}", f"tenant-b-{suffix}"
    b = await build_world(stack.channel, b_ns, bearer(b_ns))
    a = await build_world(stack.channel, a_ns, bearer(a_ns), with_turn=False, with_job=False)
    return Tenants(a, b)


# --- the suite -----------------------------------------------------------------------


def test_every_rpc_has_a_case() -> None:
    """A new RPC in any service fails here (and in the test below) until it has a case."""
    missing = sorted({rpc.id for rpc in RPCS} - CASES.keys())
    stale = sorted(CASES.keys() - {rpc.id for rpc in RPCS})
    assert not missing, f"RPCs without a tenant-isolation case: {missing}"
    assert not stale, f"cases for RPCs that no longer exist: {stale}"
    services = {rpc.service for rpc in RPCS}
    assert {s.rsplit(".", 1)[-1] for s in services} >= {
        "TranscriptService",
        "SummaryService",
        "MemoryService",
        "AgentService",
    }


async def test_the_server_serves_exactly_the_enumerated_services(stack: Stack) -> None:
    """Reflection lists no runifold service that the descriptors (hence the cases) miss."""
    stub: Any = reflection_pb2_grpc.ServerReflectionStub(stack.channel)  # type: ignore[arg-type]
    replies = [
        reply
        async for reply in stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
    ]
    served = {s.name for s in replies[0].list_services_response.service}
    assert {s for s in served if s.startswith("runifold.")} == {rpc.service for rpc in RPCS}


@pytest.mark.parametrize("transport", ["grpc", "http"])
@pytest.mark.parametrize("rpc", RPCS, ids=[rpc.id for rpc in RPCS])
async def test_tenant_a_cannot_reach_tenant_b(
    rpc: Rpc,
    transport: str,
    stack: Stack,
    model: FakeOpenAI,
    shared_database_url: str,
    tenants: Tenants,
) -> None:
    """Over gRPC, and over the HTTP port (Connect JSON, what curl and the console send),
    where every refusal of (a) is also exactly the one gRPC gives."""
    case = CASES.get(rpc.id)
    assert case is not None, f"{rpc.id} has no tenant-isolation case"
    a, b = tenants.a, tenants.b
    channel, as_a = stack.channel, a.metadata
    b_rows = await namespace_rows(shared_database_url, b.namespace)
    # Recorded once the index has caught up, so the comparison at the end sees the
    # same (semantic, not degraded) search and any difference is the probes' doing.
    b_found = await indexed_search_ids(channel, b, b.memory_content)
    assert b_found, "B's memories are searchable before the probes"
    model.requests.clear()
    received: list[Outcome] = []

    async def call(request: Message, metadata: Metadata = as_a) -> Outcome:
        if transport == "http":
            outcome = await invoke_http(stack.http_url, rpc, request, metadata)
        else:
            outcome = await invoke(channel, rpc, request, metadata)
        received.append(outcome)
        return outcome

    b_target = target_of(b)
    for index, probe in enumerate(case.probes):
        where = f"{rpc.id} probe {index}"
        if case.unscoped:
            mine = await call(probe(a.namespace, b_target, a))
            assert mine.ok, f"{where}: {mine.describe()}"
            assert MessageToDict(mine.replies[0])["namespaces"] == [a.namespace], where
            continue
        # (a) B's namespace: refused before anything is read.
        denied = await call(probe(b.namespace, b_target, a))
        assert denied.code == grpc.StatusCode.PERMISSION_DENIED, f"{where}: {denied.describe()}"
        assert denied.reason == "NAMESPACE_NOT_GRANTED", where
        nobody = await call(probe(tenants.nobody(), never_existed(b_target), a))
        assert normalized(denied, b_target) == normalized(nobody, b_target), where
        garbage = await call(probe(b.namespace, GARBAGE, a))
        assert normalized(garbage, GARBAGE) == normalized(denied, b_target), (
            f"{where}: authorization must come before validation: {garbage.describe()}"
        )
        if transport == "http":
            # The same refusal, word for word, as the gRPC listener's.
            over_grpc = await invoke(channel, rpc, probe(b.namespace, b_target, a), as_a)
            assert normalized(denied, b_target) == normalized(over_grpc, b_target), where

        # (b) A's namespace, B's ids: indistinguishable from ids that never existed.
        with_b_ids = await call(probe(a.namespace, b_target, a))
        fresh = never_existed(b_target)
        with_fresh_ids = await call(probe(a.namespace, fresh, a))
        assert normalized(with_b_ids, b_target) == normalized(with_fresh_ids, fresh), (
            f"{where}: B's ids are told apart from unknown ones:\n"
            f"  B's:   {with_b_ids.describe()}\n  fresh: {with_fresh_ids.describe()}"
        )
        allowed = case.allowed
        if transport == "http" and rpc.path in GRPC_ONLY:
            # Served over gRPC only: refused after authorization, the same for any id.
            allowed = frozenset({"UNIMPLEMENTED"})
            assert with_b_ids.reason == "GRPC_ONLY", where
        assert with_b_ids.code.name in allowed, f"{where}: {with_b_ids.describe()}"

    # Nothing revealed: not in any reply or error A got, not in any prompt.
    secrets = (b.namespace, b.marker)
    for outcome in received:
        text = _text(outcome)
        assert not any(s in text for s in secrets), f"{rpc.id} revealed B: {outcome.describe()}"
    for request in model.requests:
        body = json.dumps(request.body)
        assert not any(s in body for s in secrets), f"{rpc.id}: B's text reached A's prompt"

    # Nothing changed: every row of B, and what B's searches find.
    assert await namespace_rows(shared_database_url, b.namespace) == b_rows, rpc.id
    assert await search_ids(channel, b, b.memory_content) == b_found, rpc.id


async def test_identical_content_in_two_namespaces_stays_apart(
    stack: Stack, shared_database_url: str
) -> None:
    """Same conversation id, same entries, same memory id and content, same turn and
    request ids: each namespace sees only its own, and each write stays on its side."""
    suffix = uuid.uuid4().hex[:10]
    conversation_id, memory_id = str(uuid.uuid4()), str(uuid.uuid4())
    marker = f"twin-{suffix}"
    worlds = [
        await build_world(
            stack.channel,
            ns,
            bearer(ns),
            conversation_id=conversation_id,
            memory_id=memory_id,
            marker=marker,
        )
        for ns in (f"twin-a-{suffix}", f"twin-b-{suffix}")
    ]
    a, b = worlds
    channel = stack.channel
    for world in worlds:
        conversations = await must(
            channel,
            "TranscriptService.ListConversations",
            transcript_pb.ListConversationsRequest(namespace=world.namespace),
            world.metadata,
        )
        assert {c.namespace for c in conversations.conversations} == {world.namespace}
        assert [c.conversation_id for c in conversations.conversations].count(conversation_id) == 1
        memories = await must(
            channel,
            "MemoryService.ListMemories",
            memory_pb.ListMemoriesRequest(namespace=world.namespace),
            world.metadata,
        )
        assert {m.namespace for m in memories.memories} == {world.namespace}
        assert [m.memory_id for m in memories.memories].count(memory_id) == 1
        assert all(m.revision == 1 for m in memories.memories)
        filtered = await must(
            channel,
            "MemoryService.ListMemories",
            memory_pb.ListMemoriesRequest(
                namespace=world.namespace, conversation_id=conversation_id
            ),
            world.metadata,
        )
        assert len(filtered.memories) == 2

        async def indexed(world: World = world) -> bool:
            return len(await search_ids(channel, world, world.memory_content)) == 2

        await wait_for(indexed, timeout=20)
        hits = await search_ids(channel, world, world.memory_content)
        assert {ns for ns, _, _ in hits} == {world.namespace}
        assert [mid for _, mid, _ in hits].count(memory_id) == 1

    # The same turn id in both namespaces: two turns, neither a replay of the other.
    assert a.version == b.version == 2

    # A's writes stay in A.
    b_rows = await namespace_rows(shared_database_url, b.namespace)
    await must(
        channel,
        "TranscriptService.AppendEntries",
        transcript_pb.AppendEntriesRequest(
            namespace=a.namespace,
            conversation_id=conversation_id,
            messages=[user("only in A")],
            request_id=b.request_id + "-again",
        ),
        a.metadata,
    )
    await must(
        channel,
        "SummaryService.CommitSummary",
        summary_pb.CommitSummaryRequest(
            namespace=a.namespace, conversation_id=conversation_id, text="A's", through_sequence=4
        ),
        a.metadata,
    )
    forgot = await must(
        channel,
        "MemoryService.ForgetSource",
        memory_pb.ForgetSourceRequest(namespace=a.namespace, conversation_id=conversation_id),
        a.metadata,
    )
    assert forgot.deleted_count == 2
    deleted = await must(
        channel,
        "TranscriptService.DeleteConversation",
        transcript_pb.DeleteConversationRequest(
            namespace=a.namespace, conversation_id=conversation_id
        ),
        a.metadata,
    )
    assert deleted.deleted
    assert await namespace_rows(shared_database_url, b.namespace) == b_rows
    kept = await must(
        channel,
        "MemoryService.GetMemory",
        memory_pb.GetMemoryRequest(namespace=b.namespace, memory_id=memory_id),
        b.metadata,
    )
    assert kept.memory.content == b.memory_content
    assert (await search_ids(channel, b, b.memory_content))[0][:2] == (b.namespace, memory_id)
    gone = await invoke(
        channel,
        RPC_BY_ID["MemoryService.GetMemory"],
        memory_pb.GetMemoryRequest(namespace=a.namespace, memory_id=memory_id),
        a.metadata,
    )
    assert gone.code == grpc.StatusCode.NOT_FOUND

    async def a_search_is_empty() -> bool:
        return await search_ids(channel, a, a.memory_content) == []

    await wait_for(a_search_is_empty, timeout=20)
