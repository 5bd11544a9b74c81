"""A tenant's world: one namespace holding something of every kind of state.

A conversation with entries, an append request id, a summary, memories
derived from it, an agent turn and a summary job; a second
conversation, and page tokens of every listing. Every text carries the
world's marker, so a leak of any of it is one substring search away.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import grpc

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from tests.support.grpc_calls import user
from tests.support.waiting import wait_for
from tests.system.security.support import Metadata, must

ENTRIES = 6


def assistant(text: str) -> common_pb2.Message:
    return common_pb2.Message(role=common_pb2.ROLE_ASSISTANT, text=text)


@dataclass
class World:
    """What one namespace holds, and the ids and tokens that point into it."""

    namespace: str
    metadata: Metadata
    marker: str
    conversation_id: str
    other_conversation_id: str
    request_id: str
    version: int
    last_sequence: int
    summary_through: int
    memory_ids: list[str]
    memory_revision: int
    memory_content: str
    turn_id: str
    conversations_token: str
    entries_token: str
    memories_token: str
    # A conversation erased (EraseConversation), its incarnation and its erasure's receipt.
    erased_conversation_id: str = ""
    erased_incarnation: int = 0
    receipt_id: str = ""


def checkpoint_of(marker: str) -> transcript_pb.Checkpoint:
    """A LangGraph checkpoint as RunifoldSaver sends it (its bytes here are JSON)."""
    return transcript_pb.Checkpoint(
        checkpoint_id=f"checkpoint-{marker}",
        checkpoint=transcript_pb.TypedValue(type="json", value=b'{"v": 1}'),
        metadata_json=json.dumps({"source": "loop", "owner": marker}),
        channel_versions={"messages": "1"},
        channel_values=[
            transcript_pb.ChannelValue(
                channel="messages",
                version="1",
                value=transcript_pb.TypedValue(type="json", value=f'"{marker} state"'.encode()),
            )
        ],
    )


async def build_world(
    channel: grpc.aio.Channel,
    namespace: str,
    metadata: Metadata,
    *,
    conversation_id: str = "",
    memory_id: str = "",
    marker: str = "",
    with_turn: bool = True,
    with_job: bool = True,
) -> World:
    """Fill `namespace` through the public API with the caller's credentials.

    With an explicit `conversation_id` and `memory_id` (and `marker`), two
    namespaces can be given identical content under identical ids.
    """
    marker = marker or f"marker-{uuid.uuid4().hex}"
    conversation_id = conversation_id or str(uuid.uuid4())
    request_id = f"append-{marker}"
    await must(
        channel,
        "TranscriptService.CreateConversation",
        transcript_pb.CreateConversationRequest(
            namespace=namespace,
            conversation_id=conversation_id,
            labels={"owner": marker},
            user_id="owner",
        ),
        metadata,
    )
    messages = [
        (user if i % 2 == 0 else assistant)(f"{marker} line {i + 1}") for i in range(ENTRIES)
    ]
    appended = await must(
        channel,
        "TranscriptService.AppendEntries",
        transcript_pb.AppendEntriesRequest(
            namespace=namespace,
            conversation_id=conversation_id,
            expected_version=0,
            messages=messages,
            request_id=request_id,
            # State of every scope, so that GetState has something of B's to hide.
            state_delta=transcript_pb.StateDelta(
                conversation_json=json.dumps({"note": f"{marker} conversation state"}),
                user_json=json.dumps({"note": f"{marker} user state"}),
                namespace_json=json.dumps({"note": f"{marker} namespace state"}),
            ),
        ),
        metadata,
    )
    await must(
        channel,
        "SummaryService.CommitSummary",
        summary_pb.CommitSummaryRequest(
            namespace=namespace,
            conversation_id=conversation_id,
            text=f"summary of {marker}",
            through_sequence=2,
        ),
        metadata,
    )
    # A LangGraph checkpoint of the conversation, with a channel value and a pending
    # write, made by the run `request_id` (what DeleteCheckpoints' run_ids name).
    await must(
        channel,
        "TranscriptService.PutCheckpoint",
        transcript_pb.PutCheckpointRequest(
            namespace=namespace,
            conversation_id=conversation_id,
            checkpoint=checkpoint_of(marker),
            run_id=request_id,
        ),
        metadata,
    )
    await must(
        channel,
        "TranscriptService.PutCheckpointWrites",
        transcript_pb.PutCheckpointWritesRequest(
            namespace=namespace,
            conversation_id=conversation_id,
            checkpoint_id=f"checkpoint-{marker}",
            writes=[
                transcript_pb.CheckpointWrite(
                    task_id=f"task-{marker}",
                    channel="messages",
                    value=transcript_pb.TypedValue(type="json", value=f'"{marker}"'.encode()),
                )
            ],
        ),
        metadata,
    )
    other = await must(
        channel,
        "TranscriptService.CreateConversation",
        transcript_pb.CreateConversationRequest(namespace=namespace),
        metadata,
    )
    other_id = other.conversation.conversation_id
    await must(
        channel,
        "TranscriptService.AppendEntries",
        transcript_pb.AppendEntriesRequest(
            namespace=namespace, conversation_id=other_id, messages=[user(f"{marker} other")]
        ),
        metadata,
    )
    content = f"The tenant {marker} keeps its invoices in the blue folder."
    memory_ids = []
    revision = 0
    for index, (low, high) in enumerate(((1, 2), (3, 4))):
        upserted = await must(
            channel,
            "MemoryService.UpsertMemory",
            memory_pb.UpsertMemoryRequest(
                namespace=namespace,
                memory_id=memory_id if index == 0 else "",
                content=content if index == 0 else f"{marker} prefers short answers.",
                sources=[
                    memory_pb.MemorySource(
                        conversation_id=conversation_id, from_sequence=low, through_sequence=high
                    )
                ],
                metadata={"owner": marker},
            ),
            metadata,
        )
        memory_ids.append(upserted.memory.memory_id)
        revision = revision or upserted.memory.revision
    version, last = appended.version, appended.last_sequence
    turn_id = f"turn-{marker}"
    if with_turn:
        turn = await must(
            channel,
            "AgentService.RunConversation",
            agent_pb.RunConversationRequest(
                namespace=namespace,
                conversation_id=conversation_id,
                input=[user(f"{marker} asks a question")],
                turn_id=turn_id,
                policy=agent_pb.ContextPolicy(memory_limit=4),
            ),
            metadata,
        )
        version, last = turn.conversation_version, turn.last_sequence
    if with_job:
        # Nothing lies outside a 4096-entry window: the job finishes without a model call.
        await must(
            channel,
            "SummaryService.RequestSummary",
            summary_pb.RequestSummaryRequest(
                namespace=namespace, conversation_id=conversation_id, window=4096, summary_batch=1
            ),
            metadata,
        )
    # An erased conversation, with a memory derived from it: its receipt is kept.
    erased = await must(
        channel,
        "TranscriptService.CreateConversation",
        transcript_pb.CreateConversationRequest(namespace=namespace),
        metadata,
    )
    erased_id = erased.conversation.conversation_id
    await must(
        channel,
        "TranscriptService.AppendEntries",
        transcript_pb.AppendEntriesRequest(
            namespace=namespace, conversation_id=erased_id, messages=[user(f"{marker} erased")]
        ),
        metadata,
    )
    await must(
        channel,
        "MemoryService.UpsertMemory",
        memory_pb.UpsertMemoryRequest(
            namespace=namespace,
            content=f"{marker} said something since erased.",
            sources=[
                memory_pb.MemorySource(
                    conversation_id=erased_id, from_sequence=1, through_sequence=1
                )
            ],
        ),
        metadata,
    )
    erasure = await must(
        channel,
        "AgentService.EraseConversation",
        agent_pb.EraseConversationRequest(namespace=namespace, conversation_id=erased_id),
        metadata,
    )
    assert erasure.complete and erasure.receipt.receipt_id
    conversations = await must(
        channel,
        "TranscriptService.ListConversations",
        transcript_pb.ListConversationsRequest(namespace=namespace, page_size=1),
        metadata,
    )
    entries = await must(
        channel,
        "TranscriptService.ListEntries",
        transcript_pb.ListEntriesRequest(
            namespace=namespace, conversation_id=conversation_id, page_size=2
        ),
        metadata,
    )
    memories = await must(
        channel,
        "MemoryService.ListMemories",
        memory_pb.ListMemoriesRequest(namespace=namespace, page_size=1),
        metadata,
    )
    world = World(
        namespace=namespace,
        metadata=metadata,
        marker=marker,
        conversation_id=conversation_id,
        other_conversation_id=other_id,
        request_id=request_id,
        version=version,
        last_sequence=last,
        summary_through=2,
        memory_ids=memory_ids,
        memory_revision=revision,
        memory_content=content,
        turn_id=turn_id,
        conversations_token=conversations.next_page_token,
        entries_token=entries.next_page_token,
        memories_token=memories.next_page_token,
        erased_conversation_id=erased_id,
        erased_incarnation=erased.conversation.incarnation,
        receipt_id=erasure.receipt.receipt_id,
    )
    assert world.conversations_token and world.entries_token and world.memories_token
    return world


async def search_ids(
    channel: grpc.aio.Channel, world: World, query: str
) -> list[tuple[str, str, float]]:
    """(namespace, memory id, score) of a search in the world's namespace."""
    return _ids(await _search(channel, world, query))


async def indexed_search_ids(
    channel: grpc.aio.Channel, world: World, query: str, timeout: float = 30
) -> list[tuple[str, str, float]]:
    """`search_ids` once the indexer has caught up: a semantic search (not the
    degraded full-text one) that finds every memory of the world."""
    settled: list[tuple[str, str, float]] = []

    async def caught_up() -> bool:
        found = await _search(channel, world, query)
        settled[:] = _ids(found)
        return not found.degraded and {mid for _, mid, _ in settled} >= set(world.memory_ids)

    await wait_for(caught_up, timeout=timeout)
    return settled


async def _search(
    channel: grpc.aio.Channel, world: World, query: str
) -> memory_pb.SearchMemoriesResponse:
    found: memory_pb.SearchMemoriesResponse = await must(
        channel,
        "MemoryService.SearchMemories",
        memory_pb.SearchMemoriesRequest(namespace=world.namespace, query=query, limit=16),
        world.metadata,
    )
    return found


def _ids(found: memory_pb.SearchMemoriesResponse) -> list[tuple[str, str, float]]:
    return [(h.memory.namespace, h.memory.memory_id, round(h.score, 4)) for h in found.results]
