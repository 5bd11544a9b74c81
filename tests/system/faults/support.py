"""What the fault tests share: a PostgreSQL of their own that they stop and start, a
write load that keeps what was acknowledged, and the consistency check of a transcript
database.

The load is a set of writers, one conversation each. A writer appends with a
`request_id` and the version it expects; an error leaves the append's outcome
unknown, so the writer retries the same request (same id, same payload, same
expected version) until it gets an answer, as a client following the contract
would. An append is *acknowledged* once a reply came back: the checks then
require the database to hold exactly the acknowledged appends, each once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import grpc
import psycopg
from grpc_health.v1 import health_pb2

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common.status import error_info
from tests.support.grpc_calls import user
from tests.support.tools import ROOT
from tests.support.waiting import wait_for

if TYPE_CHECKING:
    from runifold.agent.v1.agent_service_pb2_grpc import AgentServiceAsyncStub
    from runifold.transcript.v1.transcript_service_pb2_grpc import TranscriptServiceAsyncStub

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


# -- a PostgreSQL of our own -------------------------------------------------------


class DedicatedPostgres:
    """A real PostgreSQL (pgserver's binaries) in a temporary folder, for one test.

    `stop()` and `start()` run pg_ctl as pgserver does, in a helper process
    (tests/system/faults/pgctl.py says why); the server keeps its unix-socket folder,
    so the URL stays the same across a restart.
    """

    def __init__(self, folder: Path, url: str, socket_dir: str, user: str) -> None:
        self.folder = folder
        self.url = url
        self._socket_dir = socket_dir
        self._user = user

    @classmethod
    async def create(cls) -> DedicatedPostgres:
        folder = Path(tempfile.mkdtemp(prefix="runifold-fault-pg-"))
        out = await _pgctl("init", str(folder / "data"))
        info = json.loads(out)
        return cls(folder, info["url"], info["socket_dir"], info["user"])

    async def stop(self, mode: str = "fast") -> None:
        """Stop the server (`fast`: sessions are terminated, open transactions roll back;
        `immediate`: a crash, recovered from the WAL at the next start)."""
        await _pgctl("stop", str(self.folder / "data"), self._user, mode)

    async def start(self) -> None:
        """Start it again on the same data and socket folder."""
        await _pgctl("start", str(self.folder / "data"), self._user, self._socket_dir)

    async def close(self) -> None:
        """Stop the server (if it runs) and delete its folder."""
        with contextlib.suppress(AssertionError):
            await _pgctl("stop", str(self.folder / "data"), self._user, "fast")
        shutil.rmtree(self.folder, ignore_errors=True)


async def _pgctl(*args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.system.faults.pgctl",
        *args,
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    if process.returncode != 0:
        raise AssertionError(f"pgctl {' '.join(args)} failed:\n{stderr.decode()[-2000:]}")
    return stdout.decode()


@contextlib.asynccontextmanager
async def dedicated_postgres() -> AsyncIterator[DedicatedPostgres]:
    """A DedicatedPostgres for the duration of a block."""
    server = await DedicatedPostgres.create()
    try:
        yield server
    finally:
        await server.close()


# -- the write load ----------------------------------------------------------------


def failure(error: grpc.aio.AioRpcError) -> str:
    """`CODE/REASON` of a failed call (REASON is `-` when the status has no ErrorInfo)."""
    info = error_info(error)
    return f"{error.code().name}/{info.reason if info is not None else '-'}"


@dataclass
class Acked:
    """An append a client saw succeed (an AppendEntries or a turn's commit)."""

    request_id: str
    texts: tuple[str, ...]
    version: int
    first_sequence: int
    last_sequence: int


@dataclass
class Writer:
    """One writer's conversation and what it was told."""

    index: int
    conversation_id: str
    acked: list[Acked] = field(default_factory=list)
    # request_id -> the leading texts of a write whose outcome is unknown (an error
    # came back or the connection broke): it must end absent or committed once.
    unknown: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Turns answered TURN_INTERRUPTED (their model call began under a lease that lapsed):
    # final, never committed; the writer goes on under a new turn id.
    interrupted: set[str] = field(default_factory=set)


@dataclass
class WriteLoad:
    """Writers appending to their own conversations; failures counted by code/reason."""

    namespace: str
    writers: list[Writer]
    failures: Counter[str] = field(default_factory=Counter)
    replays: int = 0
    # Set by the test: each writer finishes the write it has in flight (until it is
    # acknowledged) and starts no other.
    stopping: bool = False

    @property
    def acknowledged(self) -> int:
        return sum(len(w.acked) for w in self.writers)

    async def progress(self, more: int = 1, timeout: float = 60.0) -> None:
        """Wait until every writer has `more` writes acknowledged beyond what it has now;
        on time-out, fail with what each writer was told."""
        wanted = [len(w.acked) + more for w in self.writers]

        async def reached() -> bool:
            return all(len(w.acked) >= n for w, n in zip(self.writers, wanted, strict=True))

        try:
            await wait_for(reached, timeout=timeout)
        except AssertionError:
            state = [(len(w.acked), list(w.unknown)) for w in self.writers]
            raise AssertionError(
                f"writers stalled: wanted {wanted}, (acked, unknown) {state}, "
                f"failures {dict(self.failures)}"
            ) from None


async def start_writers(stub: TranscriptServiceAsyncStub, namespace: str, count: int) -> WriteLoad:
    """Create one conversation per writer."""
    writers = []
    for index in range(count):
        created = await stub.CreateConversation(pb.CreateConversationRequest(namespace=namespace))
        writers.append(Writer(index, created.conversation.conversation_id))
    return WriteLoad(namespace, writers)


Reply = TypeVar("Reply")


async def until_answered(
    load: WriteLoad,
    writer: Writer,
    request_id: str,
    texts: tuple[str, ...],
    call: Callable[[], Awaitable[Reply]],
    backoff: float,
    final: frozenset[str] = frozenset(),
) -> Reply | None:
    """Send one write, retrying the very same request after every error but those
    whose `code/reason` is `final` (then None: the write is over, never committed)."""
    while True:
        try:
            reply = await call()
        except grpc.aio.AioRpcError as error:
            load.failures[failure(error)] += 1
            if failure(error) in final:
                writer.unknown.pop(request_id, None)
                writer.interrupted.add(request_id)
                return None
            writer.unknown[request_id] = texts
            await asyncio.sleep(backoff)  # a client's retry backoff
            continue
        writer.unknown.pop(request_id, None)
        return reply


async def run_writer(
    stub_for: Callable[[], TranscriptServiceAsyncStub],
    load: WriteLoad,
    writer: Writer,
    *,
    backoff: float = 0.05,
    timeout: float = 10.0,
    pace: float = 0.0,
) -> None:
    """Append 1-3 messages at a time until the load is stopping, each append retried
    under its request id until acknowledged, at most one every `pace` seconds.
    `stub_for()` gives the current stub (the process may be replaced)."""
    while not load.stopping:
        if pace:
            await asyncio.sleep(pace)  # the load's pace, not a wait for a condition
        n = len(writer.acked)
        request_id = f"w{writer.index}-a{n}-{uuid.uuid4().hex[:8]}"
        texts = tuple(f"writer {writer.index} append {n} part {p}" for p in range(1 + n % 3))
        request = pb.AppendEntriesRequest(
            namespace=load.namespace,
            conversation_id=writer.conversation_id,
            expected_version=len(writer.acked),
            request_id=request_id,
            messages=[user(t) for t in texts],
        )
        reply = await until_answered(
            load,
            writer,
            request_id,
            texts,
            lambda request=request: stub_for().AppendEntries(request, timeout=timeout),  # type: ignore[misc]
            backoff,
        )
        assert reply is not None  # no error of an append is final
        load.replays += reply.replayed
        writer.acked.append(
            Acked(request_id, texts, reply.version, reply.first_sequence, reply.last_sequence)
        )


async def run_turner(
    agent_for: Callable[[], AgentServiceAsyncStub],
    load: WriteLoad,
    writer: Writer,
    *,
    memory_limit: int = 0,
    backoff: float = 0.05,
    timeout: float = 30.0,
) -> None:
    """Run agent turns until the load is stopping, each retried under its turn id until
    it answers."""
    while not load.stopping:
        n = len(writer.acked)
        turn_id = f"t{writer.index}-{n}-{uuid.uuid4().hex[:8]}"
        text = f"turner {writer.index} turn {n}: what do you remember about deploys?"
        request = agent_pb.RunConversationRequest(
            namespace=load.namespace,
            conversation_id=writer.conversation_id,
            turn_id=turn_id,
            input=[user(text)],
            # A window that holds the whole test conversation: no summary is needed.
            policy=agent_pb.ContextPolicy(window=4096, memory_limit=memory_limit),
        )
        reply = await until_answered(
            load,
            writer,
            turn_id,
            (text,),
            lambda request=request: agent_for().RunConversation(request, timeout=timeout),  # type: ignore[misc]
            backoff,
            final=frozenset({"ABORTED/TURN_INTERRUPTED"}),
        )
        if reply is None:  # its outcome is lost for good: the input goes again, anew
            continue
        load.replays += reply.replayed
        texts = (text, *(m.text for m in reply.outcome.output))
        writer.acked.append(
            Acked(
                turn_id,
                texts,
                reply.conversation_version,
                reply.first_sequence,
                reply.last_sequence,
            )
        )


# -- checking the database -----------------------------------------------------------


@dataclass
class StoredAppend:
    request_id: str
    version: int
    first_sequence: int
    last_sequence: int
    texts: tuple[str, ...]


async def stored_appends(url: str, namespace: str) -> dict[str, list[StoredAppend]]:
    """Every conversation of a namespace as its append records with their entries,
    after checking that the counters, the append log and the entries agree: versions
    1..version, one record each, whose ranges tile 1..last_sequence exactly, and no
    entry outside a recorded append (no partial append)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(
            """SELECT c.conversation_id, c.conversation_key, c.version, c.last_sequence
                 FROM transcript.conversations AS c WHERE c.namespace = %s""",
            (namespace,),
        )
        conversations = await cursor.fetchall()
        result: dict[str, list[StoredAppend]] = {}
        for cid, key, version, last_sequence in conversations:
            cursor = await conn.execute(
                """SELECT version, first_sequence, last_sequence, request_id
                     FROM transcript.appends WHERE conversation_key = %s ORDER BY version""",
                (key,),
            )
            records = await cursor.fetchall()
            cursor = await conn.execute(
                """SELECT sequence, text FROM transcript.entries
                    WHERE conversation_key = %s ORDER BY sequence""",
                (key,),
            )
            entries = await cursor.fetchall()
            assert [r[0] for r in records] == list(range(1, version + 1)), (
                f"{cid}: append versions {[r[0] for r in records]} for version {version}"
            )
            assert [e[0] for e in entries] == list(range(1, last_sequence + 1)), (
                f"{cid}: entry sequences are not 1..{last_sequence}"
            )
            expected_first = 1
            appends = []
            for record_version, first, last, request_id in records:
                assert first == expected_first and last >= first, (
                    f"{cid}: append {record_version} covers {first}..{last}"
                )
                expected_first = last + 1
                texts = tuple(text for _, text in entries[first - 1 : last])
                appends.append(StoredAppend(request_id, record_version, first, last, texts))
            assert expected_first == last_sequence + 1, f"{cid}: entries beyond the append log"
            result[str(cid)] = appends
        return result


def check_exactly_once(load: WriteLoad, stored: dict[str, list[StoredAppend]]) -> None:
    """Every acknowledged append is stored once, as acknowledged; nothing else is
    stored except, at most once each, appends whose outcome the writer never learnt."""
    for writer in load.writers:
        appends = stored[writer.conversation_id]
        by_request = Counter(a.request_id for a in appends)
        assert not writer.interrupted & set(by_request), "an interrupted turn committed"
        assert all(n == 1 for n in by_request.values()), (
            f"a request id committed twice: {by_request}"
        )
        acked = {a.request_id: a for a in writer.acked}
        for append in appends:
            if append.request_id in acked:
                seen = acked[append.request_id]
                assert (append.version, append.first_sequence, append.last_sequence) == (
                    seen.version,
                    seen.first_sequence,
                    seen.last_sequence,
                ), f"acknowledged {seen} but stored {append}"
                assert append.texts == seen.texts
            else:
                assert append.request_id in writer.unknown, (
                    f"stored append {append.request_id} that no client sent"
                )
                known = writer.unknown[append.request_id]
                assert append.texts[: len(known)] == known
        assert set(acked) <= set(by_request), "an acknowledged append is lost"


async def stop_tasks(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel the load's tasks; raise what any of them died of (a writer that crashed
    would otherwise look like one that stalled)."""
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, Exception):
            raise result


@contextlib.asynccontextmanager
async def channel_to(address: str) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(address) as channel:
        yield channel
