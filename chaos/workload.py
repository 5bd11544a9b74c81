"""The campaign's clients: random operations over a few namespaces and many
conversations, each recorded in the history with what it sent and what came back.

A client follows the contract: a call that breaks (UNAVAILABLE, DEADLINE_EXCEEDED, a
reset) is retried with the same request (the same `request_id` or `turn_id`) for a while;
if it never gets an answer its outcome is unknown. Every message the campaign writes is
a token naming its namespace, conversation, operation and place (chaos/history.py), so
that whatever is read back can be traced to the operation that wrote it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from chaos.history import DEFINITE, History, Op, token
from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.agent.v1 import agent_service_pb2_grpc as agent_grpc
from runifold.common.v1 import common_pb2
from runifold.memory.v1 import memory_service_pb2 as memory_pb
from runifold.memory.v1 import memory_service_pb2_grpc as memory_grpc
from runifold.summary.v1 import summary_service_pb2 as summary_pb
from runifold.summary.v1 import summary_service_pb2_grpc as summary_grpc
from runifold.transcript.v1 import transcript_service_pb2 as pb
from runifold.transcript.v1 import transcript_service_pb2_grpc as transcript_grpc

NAMESPACES = ("chaos-a", "chaos-b", "chaos-c")
CONVERSATIONS = 6  # per namespace
CALL_TIMEOUT_S = 8.0
RETRY_FOR_S = 20.0
_ID_SPACE = uuid.UUID("3b0f3e0e-7d0a-4c4e-9a55-5b1f0a7c9e11")

Call = Callable[[], Awaitable[Any]]


def conversation_ids(namespace: str) -> list[str]:
    return [str(uuid.uuid5(_ID_SPACE, f"{namespace}/{i}")) for i in range(CONVERSATIONS)]


def _user(text: str) -> common_pb2.Message:
    return common_pb2.Message(role=common_pb2.ROLE_USER, text=text)


def error_info(error: grpc.aio.AioRpcError) -> tuple[str, dict[str, str], list[Any]]:
    """(reason, metadata, details) of a failed call."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    reason, metadata = "", {}
    details = list(status.details) if status is not None else []
    for packed in details:
        if packed.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            packed.Unpack(info)
            reason, metadata = info.reason, dict(info.metadata)
    return reason, metadata, details


@dataclass
class Endpoints:
    transcript: list[str]
    memory: list[str]
    summary: str
    agent: list[str]


@dataclass
class Clients:
    """Channels to every service (one each, shared by the campaign's workers)."""

    endpoints: Endpoints
    channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)

    def channel(self, address: str) -> grpc.aio.Channel:
        if address not in self.channels:
            self.channels[address] = grpc.aio.insecure_channel(address)
        return self.channels[address]

    def transcript(self, rng: random.Random) -> Any:
        return transcript_grpc.TranscriptServiceStub(
            self.channel(rng.choice(self.endpoints.transcript))
        )

    def memory(self, rng: random.Random) -> Any:
        return memory_grpc.MemoryServiceStub(self.channel(rng.choice(self.endpoints.memory)))

    def summary(self) -> Any:
        return summary_grpc.SummaryServiceStub(self.channel(self.endpoints.summary))

    def agent(self, index: int) -> Any:
        return agent_grpc.AgentServiceStub(self.channel(self.endpoints.agent[index]))

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.channels.values()))


async def attempt(op: Op, call: Call, stop: asyncio.Event | None = None) -> Any:
    """Run `call` for `op` until it is answered: retried while it breaks, for up to
    RETRY_FOR_S; records the outcome (and returns the reply, or None)."""
    unknown = False
    deadline = time.monotonic() + RETRY_FOR_S
    while True:
        op.attempts += 1
        try:
            reply = await call()
        except grpc.aio.AioRpcError as error:
            code = error.code().name
            reason, metadata, details = error_info(error)
            if code in DEFINITE and reason not in ("STORE_UNAVAILABLE",):
                op.outcome = "unknown" if unknown else "fail"
                op.code, op.reason = code, reason
                op.reply = {"metadata": metadata}
                _conflict_detail(op, details)
                op.end = time.monotonic()
                return None
            unknown = True
            op.code, op.reason = code, reason
            if time.monotonic() > deadline or (stop is not None and stop.is_set()):
                op.outcome = "unknown"
                op.end = time.monotonic()
                return None
            await asyncio.sleep(0.2 + random.random() * 0.3)  # back off before the retry
            continue
        op.outcome = "ok"
        op.code = op.reason = ""
        op.end = time.monotonic()
        return reply


def _conflict_detail(op: Op, details: list[Any]) -> None:
    for packed in details:
        if packed.Is(agent_pb.TurnConflict.DESCRIPTOR):
            conflict = agent_pb.TurnConflict()
            packed.Unpack(conflict)
            op.reply["current_version"] = conflict.current_version
            op.reply["expected_version"] = conflict.expected_version


class Workload:
    """The operations, and the workers that run them until told to stop."""

    def __init__(self, clients: Clients, history: History, seed: int) -> None:
        self.clients = clients
        self.history = history
        self.seed = seed
        self.stop = asyncio.Event()
        # Memories each namespace wrote: memory id -> last revision seen.
        self.memories: dict[str, dict[str, int]] = {ns: {} for ns in NAMESPACES}
        # (start, end) of every acknowledged append, for the recovery time of a failover.
        self.ok_times: list[tuple[float, float]] = []

    # -- set-up ---------------------------------------------------------------------

    async def create_all(self) -> None:
        rng = random.Random(self.seed)
        for namespace in NAMESPACES:
            for cid in conversation_ids(namespace):
                await self.create(rng, namespace, cid)

    async def create(self, rng: random.Random, namespace: str, cid: str) -> None:
        op = self.history.begin("create", namespace, cid)
        stub = self.clients.transcript(rng)
        await attempt(
            op,
            lambda: stub.CreateConversation(
                pb.CreateConversationRequest(namespace=namespace, conversation_id=cid),
                timeout=CALL_TIMEOUT_S,
            ),
        )

    # -- the operations ---------------------------------------------------------------

    async def append(self, rng: random.Random, namespace: str, cid: str, race: bool) -> None:
        stub = self.clients.transcript(rng)
        expected: int | None = None
        if rng.random() < 0.6:
            read = self.history.begin("get", namespace, cid)
            got = await attempt(
                read,
                lambda: stub.GetConversation(
                    pb.GetConversationRequest(namespace=namespace, conversation_id=cid),
                    timeout=CALL_TIMEOUT_S,
                ),
            )
            if got is None:
                return
            expected = got.conversation.version
            read.reply = {"version": expected}
        writers = 2 if race and expected is not None else 1
        await asyncio.gather(*(self._append(rng, namespace, cid, expected) for _ in range(writers)))

    async def _append(
        self, rng: random.Random, namespace: str, cid: str, expected: int | None
    ) -> None:
        count = rng.randint(1, 3)
        request_id = f"chaos-{uuid.uuid4().hex}"
        op = self.history.begin("append", namespace, cid, request_id=request_id, count=count)
        op.request["expected_version"] = expected
        texts = [token(namespace, cid, op.id, i) for i in range(count)]
        request = pb.AppendEntriesRequest(
            namespace=namespace,
            conversation_id=cid,
            messages=[_user(text) for text in texts],
            request_id=request_id,
        )
        if expected is not None:
            request.expected_version = expected
        stub = self.clients.transcript(rng)
        reply = await attempt(op, lambda: stub.AppendEntries(request, timeout=CALL_TIMEOUT_S))
        if reply is not None:
            op.reply = {
                "version": reply.version,
                "first_sequence": reply.first_sequence,
                "last_sequence": reply.last_sequence,
            }
            self.ok_times.append((op.start, op.end))

    async def turn(self, rng: random.Random, namespace: str, cid: str, twice: bool) -> None:
        turn_id = f"chaos-turn-{uuid.uuid4().hex}"
        mode = rng.choice(
            [
                agent_pb.CONCURRENCY_MODE_RACE,
                agent_pb.CONCURRENCY_MODE_RACE,
                agent_pb.CONCURRENCY_MODE_REJECT,
                agent_pb.CONCURRENCY_MODE_ENQUEUE,
            ]
        )
        agents = [rng.randrange(2)]
        if twice:
            agents.append(1 - agents[0])  # the same turn, at the same time, on the other
        first = self.history.begin("turn", namespace, cid, turn_id=turn_id, count=2)
        text = token(namespace, cid, first.id, 0)
        ops = [first] + [
            self.history.begin("turn", namespace, cid, turn_id=turn_id, count=2, repeat_of=first.id)
            for _ in agents[1:]
        ]
        request = agent_pb.RunConversationRequest(
            namespace=namespace,
            conversation_id=cid,
            input=[_user(text)],
            turn_id=turn_id,
            concurrency=mode,
            policy=agent_pb.ContextPolicy(
                window=8, summary_mode=agent_pb.SUMMARY_MODE_AUTO, memory_limit=2
            ),
        )
        for op in ops:
            op.request["concurrency"] = int(mode)

        async def run(op: Op, index: int) -> None:
            stub = self.clients.agent(index)
            reply = await attempt(
                op, lambda: stub.RunConversation(request, timeout=CALL_TIMEOUT_S * 2)
            )
            if reply is not None:
                op.reply = {
                    "version": reply.conversation_version,
                    "first_sequence": reply.first_sequence,
                    "last_sequence": reply.last_sequence,
                    "replayed": reply.replayed,
                }

        await asyncio.gather(*(run(op, index) for op, index in zip(ops, agents, strict=True)))

    async def erase(self, rng: random.Random, namespace: str, cid: str) -> None:
        op = self.history.begin("erase", namespace, cid)
        stub = self.clients.agent(rng.randrange(2))

        async def until_complete() -> Any:
            reply = await stub.EraseConversation(
                agent_pb.EraseConversationRequest(namespace=namespace, conversation_id=cid),
                timeout=CALL_TIMEOUT_S * 2,
            )
            if not reply.complete:
                raise _Incomplete()
            return reply

        deadline = time.monotonic() + 60
        while not self.stop.is_set() or op.attempts == 0:
            try:
                reply = await attempt(op, until_complete)
            except _Incomplete:
                op.outcome = "unknown"
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)  # the rest of the erasure is retried
                continue
            if reply is not None or op.outcome != "unknown" or time.monotonic() > deadline:
                break
        await self.create(rng, namespace, cid)

    async def read(self, rng: random.Random, namespace: str, cid: str) -> None:
        choice = rng.random()
        if choice < 0.4:
            op = self.history.begin("list-entries", namespace, cid)
            stub = self.clients.transcript(rng)
            reply = await attempt(
                op,
                lambda: stub.ListEntries(
                    pb.ListEntriesRequest(namespace=namespace, conversation_id=cid, page_size=200),
                    timeout=CALL_TIMEOUT_S,
                ),
            )
            if reply is not None:
                op.reply = {"texts": [e.message.text for e in reply.entries]}
        elif choice < 0.8:
            op = self.history.begin("search", namespace)
            stub = self.clients.memory(rng)
            reply = await attempt(
                op,
                lambda: stub.SearchMemories(
                    memory_pb.SearchMemoriesRequest(
                        namespace=namespace, query=token(namespace, cid, 0, 0), limit=8
                    ),
                    timeout=CALL_TIMEOUT_S,
                ),
            )
            if reply is not None:
                op.reply = {"texts": [r.memory.content for r in reply.results]}
        else:
            op = self.history.begin("list-memories", namespace)
            stub = self.clients.memory(rng)
            reply = await attempt(
                op,
                lambda: stub.ListMemories(
                    memory_pb.ListMemoriesRequest(namespace=namespace, page_size=100),
                    timeout=CALL_TIMEOUT_S,
                ),
            )
            if reply is not None:
                op.reply = {"texts": [m.content for m in reply.memories]}
                for memory in reply.memories:
                    self._saw(namespace, memory.memory_id, memory.revision)

    async def upsert(self, rng: random.Random, namespace: str, cid: str) -> None:
        known = self.memories[namespace]
        update = bool(known) and rng.random() < 0.4
        op = self.history.begin("upsert", namespace, cid)
        request = memory_pb.UpsertMemoryRequest(
            namespace=namespace,
            content=token(namespace, cid, op.id, 0),
            sources=[
                memory_pb.MemorySource(conversation_id=cid, from_sequence=1, through_sequence=1)
            ],
            request_id=f"chaos-memory-{uuid.uuid4().hex}",
        )
        if update:
            memory_id = rng.choice(sorted(known))
            request.memory_id = memory_id
            request.expected_revision = known[memory_id]
            op.request["expected_revision"] = known[memory_id]
        stub = self.clients.memory(rng)
        reply = await attempt(op, lambda: stub.UpsertMemory(request, timeout=CALL_TIMEOUT_S))
        if reply is not None:
            op.reply = {"memory_id": reply.memory.memory_id, "revision": reply.memory.revision}
            self._saw(namespace, reply.memory.memory_id, reply.memory.revision)

    async def forget(self, rng: random.Random, namespace: str, cid: str) -> None:
        op = self.history.begin("forget", namespace, cid)
        stub = self.clients.memory(rng)
        await attempt(
            op,
            lambda: stub.ForgetSource(
                memory_pb.ForgetSourceRequest(namespace=namespace, conversation_id=cid),
                timeout=CALL_TIMEOUT_S,
            ),
        )

    async def propose(self, rng: random.Random, namespace: str, cid: str) -> None:
        op = self.history.begin("propose", namespace, cid)
        stub = self.clients.memory(rng)
        reply = await attempt(
            op,
            lambda: stub.ProposeMemories(
                memory_pb.ProposeMemoriesRequest(
                    namespace=namespace, conversation_id=cid, from_sequence=1, through_sequence=1
                ),
                timeout=CALL_TIMEOUT_S,
            ),
        )
        if reply is not None:
            op.reply = {"texts": [p.content for p in reply.proposals]}

    async def summarize(self, rng: random.Random, namespace: str, cid: str) -> None:
        stub = self.clients.summary()
        if rng.random() < 0.5:
            op = self.history.begin("request-summary", namespace, cid)
            await attempt(
                op,
                lambda: stub.RequestSummary(
                    summary_pb.RequestSummaryRequest(
                        namespace=namespace, conversation_id=cid, window=4, summary_batch=8
                    ),
                    timeout=CALL_TIMEOUT_S,
                ),
            )
        else:
            op = self.history.begin("summarize", namespace, cid)
            await attempt(
                op,
                lambda: stub.Summarize(
                    summary_pb.SummarizeRequest(
                        namespace=namespace, conversation_id=cid, window=4, summary_batch=8
                    ),
                    timeout=CALL_TIMEOUT_S,
                ),
            )

    def _saw(self, namespace: str, memory_id: str, revision: int) -> None:
        known = self.memories[namespace]
        known[memory_id] = max(revision, known.get(memory_id, 0))

    # -- the workers ------------------------------------------------------------------

    async def worker(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        choices: list[tuple[str, int]] = [
            ("append", 30),
            ("turn", 20),
            ("read", 12),
            ("upsert", 10),
            ("summary", 5),
            ("propose", 3),
            ("forget", 2),
            ("erase", 3),
        ]
        kinds, weights = zip(*choices, strict=True)
        while not self.stop.is_set():
            namespace = rng.choice(NAMESPACES)
            cid = rng.choice(conversation_ids(namespace))
            kind = rng.choices(kinds, weights)[0]
            if kind == "append":
                await self.append(rng, namespace, cid, race=rng.random() < 0.2)
            elif kind == "turn":
                await self.turn(rng, namespace, cid, twice=rng.random() < 0.15)
            elif kind == "read":
                await self.read(rng, namespace, cid)
            elif kind == "upsert":
                await self.upsert(rng, namespace, cid)
            elif kind == "summary":
                await self.summarize(rng, namespace, cid)
            elif kind == "propose":
                await self.propose(rng, namespace, cid)
            elif kind == "forget":
                await self.forget(rng, namespace, cid)
            elif kind == "erase":
                await self.erase(rng, namespace, cid)

    async def watcher(self, index: int) -> None:
        """Follows one conversation after another: each stream is one operation, a
        broken stream resumed from its last entry by the next one."""
        rng = random.Random(self.seed * 7000 + index)
        while not self.stop.is_set():
            namespace = rng.choice(NAMESPACES)
            cid = rng.choice(conversation_ids(namespace))
            after, incarnation = 0, 0
            for _ in range(rng.randint(1, 4)):
                if self.stop.is_set():
                    break
                after, incarnation, ended = await self._follow(
                    rng, namespace, cid, after, incarnation, rng.uniform(3, 12)
                )
                if ended:
                    break

    async def _follow(
        self,
        rng: random.Random,
        namespace: str,
        cid: str,
        after: int,
        incarnation: int,
        seconds: float,
    ) -> tuple[int, int, bool]:
        op = self.history.begin("watch", namespace, cid, after_sequence=after)
        op.request["incarnation"] = incarnation
        op.reply = {"entries": [], "incarnation": incarnation, "texts": []}
        stub = self.clients.transcript(rng)
        call = stub.WatchConversation(
            pb.WatchConversationRequest(
                namespace=namespace,
                conversation_id=cid,
                after_sequence=after,
                incarnation=incarnation,
            )
        )
        ended = False
        until = time.monotonic() + seconds
        try:
            async with asyncio.timeout(max(0.1, until - time.monotonic())):
                async for event in call:
                    kind = event.WhichOneof("event")
                    if kind == "appended":
                        op.reply["incarnation"] = event.appended.incarnation
                        for entry in event.appended.entries:
                            op.reply["entries"].append((entry.sequence, entry.message.text))
                            op.reply["texts"].append(entry.message.text)
                            after = entry.sequence
                    elif kind == "heartbeat":
                        op.reply["incarnation"] = event.heartbeat.incarnation
                    elif kind == "erased":
                        ended = True
                        break
                    if self.stop.is_set():
                        break
            op.outcome = "ok"
        except TimeoutError:
            op.outcome = "ok"
        except grpc.aio.AioRpcError as error:
            op.code = error.code().name
            op.reason = error_info(error)[0]
            op.outcome = "fail" if op.code in ("NOT_FOUND", "INVALID_ARGUMENT") else "unknown"
            ended = op.code in ("NOT_FOUND", "INVALID_ARGUMENT")
        finally:
            call.cancel()
            op.end = time.monotonic()
        return after, int(op.reply["incarnation"]), ended


class _Incomplete(Exception):
    """An erasure answered with parts still to erase: retried."""


@contextlib.asynccontextmanager
async def clients(endpoints: Endpoints) -> Any:
    made = Clients(endpoints)
    try:
        yield made
    finally:
        await made.close()
