"""AgentService benchmark (issue 5): the orchestrator's own overhead.

The all-in-one server runs in its own process with the offline model (zero
model latency) and memory lookup on; a turn's window is 16. We time turns at
1 and 16 in flight, then each downstream RPC alone with the same arguments
(GetSummary, LoadView, SearchMemories with its query embedding, AppendEntries)
so that the turn's p50 can be compared with the sum of theirs.
Goal: turn p50 < sum of downstream p50s + 5 ms.

The turn lease (issue 12): a turn takes a lease (AcquireTurnLease) and commits
with a fenced append that ends it. A RACE turn (the default) takes the lease
while its context (GetSummary, then LoadView) loads, so what the lease adds to
its critical path is the fenced append's extra work plus whatever of the
acquisition the context load does not cover; an exclusive turn (REJECT,
ENQUEUE) takes the lease first. Both parts are timed directly, in the same run,
interleaved with plain appends (goal: under 1 ms added at p50).
"""

from __future__ import annotations

import tempfile
import time
import uuid

import grpc

from bench.common import Stats, measure, new_database, seed_conversation, server_process
from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from runifold_client.policy import assistant, user
from services.common import stubs

NAMESPACE = "bench-agent"
FACTS = [
    "The team chose PostgreSQL for transcripts.",
    "Deploys happen on Tuesdays.",
    "The on-call rotation changes every Monday.",
    "The user's favourite editor is Helix.",
    "Budgets are reviewed at the end of each quarter.",
    "The staging cluster runs in Frankfurt.",
    "Incidents are tracked in the ops channel.",
    "The API gateway enforces a 30 second timeout.",
]
QUESTION = "What did we decide about storage?"


async def run(postgres_url: str) -> list[str]:
    url = new_database(postgres_url)
    lines = ["## AgentService (offline model, memory lookup on, window 16)", ""]
    with tempfile.TemporaryDirectory(prefix="runifold-bench-agent-") as data:
        env = {
            "RUNIFOLD_DATA_DIR": data,
            "RUNIFOLD_DB_POOL_MAX": "24",
            "RUNIFOLD_SUMMARY_WORKERS": "0",
        }
        async with (
            server_process("services", url, env) as address,
            grpc.aio.insecure_channel(address) as channel,
        ):
            transcript, summary = stubs.transcript(channel), stubs.summary(channel)
            memory, agent = stubs.memory(channel), stubs.agent(channel)
            seed = await seed_conversation(transcript, NAMESPACE, FACTS)
            for index, fact in enumerate(FACTS, start=1):
                await memory.UpsertMemory(
                    memory_pb.UpsertMemoryRequest(
                        namespace=NAMESPACE,
                        content=fact,
                        sources=[
                            memory_pb.MemorySource(
                                conversation_id=seed, from_sequence=index, through_sequence=index
                            )
                        ],
                    )
                )

            # Window 16, memory on, no summarization: a conversation serves 7 turns (14
            # entries, all inside the window), then the worker starts a new one. (With
            # a longer conversation every turn would also summarize the 2 entries that
            # leave the window: that is the summarizer's cost, not the orchestrator's.)
            policy = agent_pb.ContextPolicy(window=16, summary_batch=64, memory_limit=4)
            conversations: dict[int, tuple[str, int]] = {}

            async def conversation_for(worker: int) -> str:
                cid, turns = conversations.get(worker, ("", 7))
                if turns >= 7:
                    cid = (
                        await transcript.CreateConversation(
                            transcript_pb.CreateConversationRequest(namespace=NAMESPACE)
                        )
                    ).conversation.conversation_id
                    turns = 0
                conversations[worker] = (cid, turns + 1)
                return cid

            async def one_turn(worker: int, _: int) -> None:
                cid = await conversation_for(worker)
                await agent.RunConversation(
                    agent_pb.RunConversationRequest(
                        namespace=NAMESPACE,
                        conversation_id=cid,
                        input=[user(QUESTION)],
                        turn_id=str(uuid.uuid4()),
                        policy=policy,
                    )
                )

            turns1 = await measure("RunConversation, 1 in flight", 1, 300, one_turn, warmup=20)
            turns16 = await measure("RunConversation, 16 in flight", 16, 960, one_turn, warmup=20)

            probe = await conversation_for(99)
            for _ in range(5):
                await one_turn(99, 0)

            async def get_summary(_: int, __: int) -> None:
                await summary.GetSummary(
                    summary_pb.GetSummaryRequest(namespace=NAMESPACE, conversation_id=probe)
                )

            async def load_view(_: int, __: int) -> None:
                await transcript.LoadView(
                    transcript_pb.LoadViewRequest(
                        namespace=NAMESPACE,
                        conversation_id=probe,
                        window=16,
                        summary_batch=64,
                        request_id=str(uuid.uuid4()),
                    )
                )

            async def search(_: int, __: int) -> None:
                await memory.SearchMemories(
                    memory_pb.SearchMemoriesRequest(namespace=NAMESPACE, query=QUESTION, limit=4)
                )

            versions = {
                "v": (
                    await transcript.GetConversation(
                        transcript_pb.GetConversationRequest(
                            namespace=NAMESPACE, conversation_id=probe
                        )
                    )
                ).conversation.version
            }

            async def append(_: int, __: int) -> None:
                reply = await transcript.AppendEntries(
                    transcript_pb.AppendEntriesRequest(
                        namespace=NAMESPACE,
                        conversation_id=probe,
                        expected_version=versions["v"],
                        request_id=str(uuid.uuid4()),
                        messages=[
                            user(QUESTION),
                            assistant("an answer of some length"),
                        ],
                    )
                )
                versions["v"] = reply.version

            acquired: list[float] = []
            fenced: list[float] = []

            async def leased_append(_: int, i: int) -> None:
                turn_id = str(uuid.uuid4())
                started = time.perf_counter()
                lease = await transcript.AcquireTurnLease(
                    transcript_pb.AcquireTurnLeaseRequest(
                        namespace=NAMESPACE,
                        conversation_id=probe,
                        turn_id=turn_id,
                        payload_hash=b"bench",
                    )
                )
                leased = time.perf_counter()
                reply = await transcript.AppendEntries(
                    transcript_pb.AppendEntriesRequest(
                        namespace=NAMESPACE,
                        conversation_id=probe,
                        expected_version=versions["v"],
                        request_id=turn_id,
                        fencing_token=lease.lease.fencing_token,
                        messages=[user(QUESTION), assistant("an answer of some length")],
                    )
                )
                if i >= 0:  # not a warm-up
                    acquired.append(leased - started)
                    fenced.append(time.perf_counter() - leased)
                versions["v"] = reply.version

            parts: list[Stats] = [
                await measure("  GetSummary", 1, 300, get_summary),
                await measure("  LoadView (window 16)", 1, 300, load_view),
                await measure("  SearchMemories (limit 4, embedding included)", 1, 300, search),
                await measure("  AppendEntries (2 messages)", 1, 300, append),
            ]
            # Interleaved rounds, so that drift on a busy machine hits both alike.
            plain: list[Stats] = []
            leased: list[Stats] = []
            for _ in range(3):
                plain.append(await measure("plain", 1, 200, append, warmup=10))
                leased.append(await measure("leased", 1, 200, leased_append, warmup=10))
    lines += [turns1.row(), turns16.row(), "downstream RPCs alone, 1 in flight:"]
    lines += [part.row() for part in parts]
    budget = sum(part.p50 for part in parts)
    lines.append(
        f"turn p50 {turns1.p50:.2f} ms vs sum of downstream p50 {budget:.2f} ms "
        f"+ 5 ms = {budget + 5:.2f} ms (goal: below)"
    )
    plain_p50 = Stats("plain", [x for s in plain for x in s.latencies], 1.0).p50
    acquire_p50 = Stats("acquire", acquired, 1.0).p50
    fenced_p50 = Stats("fenced", fenced, 1.0).p50
    context_p50 = parts[0].p50 + parts[1].p50  # GetSummary then LoadView, beside the lease
    race_added = fenced_p50 - plain_p50 + max(0.0, acquire_p50 - context_p50)
    exclusive_added = fenced_p50 - plain_p50 + acquire_p50
    lines += [
        "the turn lease, 1 in flight (3 interleaved rounds of 200):",
        f"  AppendEntries, plain                             p50 {plain_p50:>7.2f} ms",
        f"  AppendEntries, fenced (ends the lease)           p50 {fenced_p50:>7.2f} ms",
        f"  AcquireTurnLease (shared, a new turn id)         p50 {acquire_p50:>7.2f} ms",
        f"  context load beside it (GetSummary + LoadView)   p50 {context_p50:>7.2f} ms",
        f"added to a RACE turn's critical path {race_added:.2f} ms at p50 (goal: under 1 ms); "
        f"to a REJECT/ENQUEUE turn (lease first) {exclusive_added:.2f} ms",
    ]
    return lines
