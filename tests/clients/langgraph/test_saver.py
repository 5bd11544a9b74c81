"""RunifoldSaver against a real all-in-one server: exact round trips with values stored
once per version, LangGraph graphs run on it (sync and async, resumed by another saver),
its limits, namespace isolation, lease fencing (a stale writer refused), one run per
thread across two processes (reject and enqueue), and delete_thread as an erasure that
ends a watch open on the thread."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint

from runifold_client import AsyncClient, TurnLeaseMode
from runifold_client.errors import ConversationBusy, InvalidArgument, NotFound, TurnLeaseLost
from runifold_client.langgraph import RunifoldSaver
from services.transcript.checkpoints.model import DELTA_MAX_DEPTH
from tests.clients.langgraph.graph_peer import build
from tests.support.stack import Stack
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def namespace() -> str:
    return f"lg-{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def client(stack: Stack, namespace: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(stack.address, namespace=namespace) as c:
        yield c


@pytest.fixture
def saver(client: AsyncClient) -> RunifoldSaver:
    return RunifoldSaver(client=client)


def config(thread_id: str, checkpoint_id: str | None = None, ns: str = "") -> dict[str, Any]:
    configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def checkpoint(values: dict[str, Any], versions: dict[str, Any]) -> Any:
    made = empty_checkpoint()
    made["channel_values"] = values
    made["channel_versions"] = versions
    return made


async def blob_rows(database_url: str, conversation_id: str) -> list[tuple[str, str]]:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute(
            """SELECT b.channel, b.version FROM transcript.checkpoint_blobs AS b
                 JOIN transcript.conversations AS c USING (conversation_key)
                WHERE c.conversation_id = %s ORDER BY 1, 2""",
            (conversation_id,),
        )
        return [(row[0], row[1]) for row in await cursor.fetchall()]


async def test_round_trips_are_exact_and_values_are_stored_once_per_version(
    saver: RunifoldSaver, client: AsyncClient, shared_database_url: str
) -> None:
    thread = f"thread-{uuid.uuid4().hex}"  # not a UUID: mapped to a UUIDv5
    big = {"blob": bytes(range(256)) * 64, "text": "ünïcödé", "n": 2**62, "f": 0.1, "none": None}
    first = checkpoint({"big": big, "small": "a"}, {"big": 1, "small": 1})
    stored = await saver.aput(
        config(thread), first, {"source": "input", "step": -1}, {"big": 1, "small": 1}
    )
    parent = stored["configurable"]["checkpoint_id"]
    # Three more steps that change only `small`: `big` is never sent nor stored again.
    for step in range(3):
        nxt = checkpoint({"big": big, "small": f"s{step}"}, {"big": 1, "small": step + 2})
        stored = await saver.aput(
            config(thread, parent), nxt, {"source": "loop", "step": step}, {"small": step + 2}
        )
        parent = stored["configurable"]["checkpoint_id"]
    await saver.aput_writes(stored, [("small", b"\x00raw"), ("__error__", "boom")], "task-1", "p")
    conversation_id = saver.conversation_id(thread)
    assert conversation_id == str(uuid.UUID(conversation_id)) and conversation_id != thread
    assert await blob_rows(shared_database_url, conversation_id) == [
        ("big", "1"),
        *[("small", str(v)) for v in range(1, 5)],
    ]
    # What the server holds is the serializer's own bytes, verbatim.
    raw = await client.get_checkpoint(conversation_id)
    assert raw is not None
    values = {v.channel: (v.value.type, v.value.value) for v in raw.channel_values}
    assert values["big"] == tuple(saver.serde.dumps_typed(big))
    found = await saver.aget_tuple(config(thread))
    assert found is not None
    assert found.checkpoint["channel_values"] == {"big": big, "small": "s2"}
    assert found.checkpoint["channel_versions"] == {"big": 1, "small": 4}
    assert found.metadata == {"source": "loop", "step": 2}
    # In writes_sort_key order: the error's special index (-1) first.
    assert found.pending_writes == [
        ("task-1", "__error__", "boom"),
        ("task-1", "small", b"\x00raw"),
    ]
    history = [t async for t in saver.alist(config(thread))]
    assert [t.checkpoint["channel_values"]["small"] for t in history] == ["s2", "s1", "s0", "a"]
    assert history[-1].checkpoint["channel_values"]["big"] == big
    # The sync methods are the same calls (from a thread: they block).
    assert await asyncio.to_thread(saver.get_tuple, config(thread)) == found
    listed = await asyncio.to_thread(lambda: list(saver.list(config(thread), limit=2)))
    assert [t.config for t in listed] == [h.config for h in history[:2]]
    # prune keeps the newest and the values it names; the others' values go.
    await saver.aprune([thread])
    assert await blob_rows(shared_database_url, conversation_id) == [("big", "1"), ("small", "4")]
    assert (await saver.aget_tuple(config(thread))) == found


async def test_a_graph_runs_and_resumes_on_another_saver(stack: Stack, namespace: str) -> None:
    thread = str(uuid.uuid4())
    async with AsyncClient(stack.address, namespace=namespace) as one:
        graph = build(RunifoldSaver(client=one), "async")
        await graph.ainvoke({"messages": [HumanMessage("hi")]}, config(thread))
    # Another saver, sync (in a thread of its own, as sync code runs), in the same thread:
    # the state goes on from the checkpoint.
    other = RunifoldSaver(target=stack.address, namespace=namespace)

    def run_sync() -> tuple[Any, list[int]]:
        result = build(other, "sync").invoke({"messages": [HumanMessage("again")]}, config(thread))
        return result, [t.metadata["step"] for t in other.list(config(thread))]

    try:
        result, steps = await asyncio.to_thread(run_sync)
    finally:
        other.close()
    texts = [m.content for m in result["messages"]]
    assert texts == ["hi", "async-1", "async-2", "again", "sync-1", "sync-2"]
    assert isinstance(result["messages"][1], AIMessage)
    assert steps == sorted(steps, reverse=True) and len(steps) == 8


async def test_limits_refuse_and_write_nothing(saver: RunifoldSaver) -> None:
    thread = str(uuid.uuid4())
    with pytest.raises(InvalidArgument) as too_large:
        await saver.aput(
            config(thread), checkpoint({"x": b"x" * (2 * 1024 * 1024 + 1)}, {"x": 1}), {}, {"x": 1}
        )
    assert too_large.value.reason == "CHECKPOINT_VALUE_TOO_LARGE"
    many = {f"c{i}": i for i in range(257)}
    with pytest.raises(InvalidArgument) as too_many:
        await saver.aput(
            config(thread), checkpoint(many, dict.fromkeys(many, 1)), {}, dict.fromkeys(many, 1)
        )
    assert too_many.value.reason == "TOO_MANY_CHECKPOINT_VALUES"
    with pytest.raises(InvalidArgument) as metadata:
        await saver.aput(config(thread), checkpoint({}, {}), {"big": "m" * 70_000}, {})
    assert metadata.value.reason == "CHECKPOINT_METADATA_TOO_LARGE"
    with pytest.raises(InvalidArgument) as filtered:
        async for _ in saver.client.list_checkpoints(
            saver.conversation_id(thread), filter_json="[1]"
        ):
            pass
    assert filtered.value.reason == "INVALID_CHECKPOINT_FILTER"
    assert await saver.aget_tuple(config(thread)) is None


async def test_a_thread_of_one_namespace_is_invisible_from_another(
    stack: Stack, saver: RunifoldSaver
) -> None:
    thread = str(uuid.uuid4())
    stored = await saver.aput(
        config(thread), checkpoint({"k": "secret"}, {"k": 1}), {"run_id": "r1"}, {"k": 1}
    )
    async with AsyncClient(stack.address, namespace=f"lg-other-{uuid.uuid4().hex[:8]}") as c:
        other = RunifoldSaver(client=c)
        assert await other.aget_tuple(config(thread)) is None
        assert [t async for t in other.alist(config(thread))] == []
        await other.adelete_for_runs(["r1"])
        await other.aprune([thread], strategy="delete")
        await other.adelete_thread(thread)
        await other.acopy_thread(thread, str(uuid.uuid4()))
    found = await saver.aget_tuple(stored)
    assert found is not None and found.checkpoint["channel_values"] == {"k": "secret"}


async def test_a_stale_writer_that_lost_its_lease_cannot_put(
    saver: RunifoldSaver, client: AsyncClient
) -> None:
    thread = str(uuid.uuid4())
    cid = saver.conversation_id(thread)
    await client.create_conversation(conversation_id=cid)
    first = await client.acquire_turn_lease(cid, "run-1", mode=TurnLeaseMode.EXCLUSIVE, ttl=1.0)
    stale = {
        "configurable": {
            **config(thread)["configurable"],
            "__runifold_turn_id": "run-1",
            "__runifold_fencing_token": first.lease.fencing_token,
        }
    }
    await saver.aput(stale, checkpoint({"k": "one"}, {"k": 1}), {}, {"k": 1})
    # Unfenced writers are refused while the run holds the thread.
    with pytest.raises(ConversationBusy):
        await saver.aput(config(thread), checkpoint({"k": "x"}, {"k": 2}), {}, {"k": 2})
    # The first run stalls (no renewal); its lease lapses and a second run takes over.
    second: list[Any] = []

    async def taken_over() -> bool:
        try:
            second.append(
                await client.acquire_turn_lease(
                    cid, "run-2", mode=TurnLeaseMode.EXCLUSIVE, ttl=30.0
                )
            )
        except ConversationBusy:
            return False
        return True

    await wait_for(taken_over, timeout=15.0)
    with pytest.raises(TurnLeaseLost):
        await saver.aput(stale, checkpoint({"k": "stale"}, {"k": 3}), {}, {"k": 3})
    with pytest.raises(TurnLeaseLost):
        await saver.aput_writes(
            {"configurable": {**stale["configurable"], "checkpoint_id": "x"}}, [("k", 1)], "t"
        )
    fresh = {
        "configurable": {
            **config(thread)["configurable"],
            "__runifold_turn_id": "run-2",
            "__runifold_fencing_token": second[0].lease.fencing_token,
        }
    }
    await saver.aput(fresh, checkpoint({"k": "two"}, {"k": 4}), {}, {"k": 4})
    found = await saver.aget_tuple(config(thread))
    assert found is not None and found.checkpoint["channel_values"] == {"k": "two"}
    assert [t.checkpoint["channel_values"]["k"] async for t in saver.alist(config(thread))] == [
        "two",
        "one",
    ]


async def _peer(
    stack: Stack, namespace: str, thread: str, strategy: str, name: str, *extra: str
) -> Any:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT), str(ROOT / "clients/python"), str(ROOT / "gen/python")]
        ),
    }
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.clients.langgraph.graph_peer",
        stack.address,
        namespace,
        thread,
        strategy,
        name,
        *extra,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )


async def _line(process: Any) -> str:
    line: bytes = await asyncio.wait_for(process.stdout.readline(), 60)
    return line.decode().strip()


@pytest.mark.parametrize("strategy", ["reject", "enqueue"])
async def test_one_run_per_thread_across_two_processes(
    stack: Stack, saver: RunifoldSaver, namespace: str, strategy: str, shared_database_url: str
) -> None:
    thread = str(uuid.uuid4())
    peer = await _peer(stack, namespace, thread, "reject", "peer")
    try:
        assert await _line(peer) == "holding"  # the peer's run holds the thread, mid-step
        graph = build(saver, "here")
        if strategy == "reject":
            with pytest.raises(ConversationBusy):
                async with saver.athread_run(config(thread), multitask_strategy="reject"):
                    pass
            peer.stdin.write(b"go\n")
            await peer.stdin.drain()
            assert await _line(peer) == "done"
        else:

            async def ours() -> None:
                async with saver.athread_run(
                    config(thread), multitask_strategy="enqueue"
                ) as fenced:
                    await graph.ainvoke({"messages": []}, fenced)

            run = asyncio.create_task(ours())
            # Ours waits in line (the server's queue) while the peer holds the thread.
            cid = saver.conversation_id(thread)
            await wait_for(lambda: _queued(shared_database_url, cid), timeout=30.0)
            assert not run.done()
            peer.stdin.write(b"go\n")
            await peer.stdin.drain()
            assert await _line(peer) == "done"
            await asyncio.wait_for(run, 60)
        assert await peer.wait() == 0
    finally:
        if peer.returncode is None:
            peer.kill()
            await peer.wait()
    found = await saver.aget_tuple(config(thread))
    assert found is not None
    texts = [m.content for m in found.checkpoint["channel_values"]["messages"]]
    # No interleaving: each run's steps together, the peer's first.
    assert texts == (
        ["peer-1", "peer-2"] if strategy == "reject" else ["peer-1", "peer-2", "here-1", "here-2"]
    )


async def _queued(database_url: str, conversation_id: str) -> bool:
    """Whether a turn waits in line on the conversation (AcquireTurnLease, queued)."""
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute(
            """SELECT count(*) FROM transcript.turns AS t
                 JOIN transcript.conversations AS c USING (conversation_key)
                WHERE c.conversation_id = %s AND t.state = 'waiting'""",
            (conversation_id,),
        )
        row = await cursor.fetchone()
        return bool(row and row[0])


async def _rows_of(database_url: str, key: int) -> list[int]:
    """The checkpoint, value and write rows of a conversation key."""
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        counts = []
        for table in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
            cursor = await conn.execute(
                f"SELECT count(*) FROM transcript.{table} WHERE conversation_key = %s",
                (key,),
            )
            row = await cursor.fetchone()
            counts.append(int(row[0]) if row else 0)
        return counts


async def test_delete_thread_erases_and_ends_a_watch_open_on_it(
    saver: RunifoldSaver, client: AsyncClient, shared_database_url: str
) -> None:
    thread = str(uuid.uuid4())
    stored = await saver.aput(config(thread), checkpoint({"k": "v"}, {"k": 1}), {}, {"k": 1})
    await saver.aput_writes(stored, [("k", "w")], "task")
    cid = saver.conversation_id(thread)
    await client.append(cid, "a message of the thread")
    async with await psycopg.AsyncConnection.connect(shared_database_url) as conn:
        cursor = await conn.execute(
            "SELECT conversation_key FROM transcript.conversations WHERE conversation_id = %s",
            (cid,),
        )
        row = await cursor.fetchone()
        assert row is not None
        key = int(row[0])
    assert await _rows_of(shared_database_url, key) == [1, 1, 1]
    events: list[str] = []
    seen = asyncio.Event()

    async def watch() -> None:
        async for event in client.watch_conversation(cid):
            events.append(event.WhichOneof("event") or "")
            seen.set()

    watching = asyncio.create_task(watch())
    await asyncio.wait_for(seen.wait(), 30)
    await saver.adelete_thread(thread)
    await asyncio.wait_for(watching, 30)  # the stream ends with the erasure
    assert events[0] == "appended" and events[-1] == "erased"
    assert await saver.aget_tuple(config(thread)) is None
    assert await _rows_of(shared_database_url, key) == [0, 0, 0]
    # The erasure's receipt counts the thread's checkpoint (no content).
    receipt = await client.erasure_receipt(conversation_id=cid)
    assert (receipt.checkpoints, receipt.entries) == (1, 1)
    await saver.adelete_thread(thread)  # a repeat is a no-op
    # A run still in flight puts its next checkpoint (it has a parent): the erased
    # thread does not come back.
    with pytest.raises(NotFound):
        await saver.aput(
            config(thread, stored["configurable"]["checkpoint_id"]),
            checkpoint({"k": "after"}, {"k": 2}),
            {},
            {"k": 2},
        )
    with pytest.raises(NotFound):
        await client.get_conversation(cid)


async def test_a_growing_message_list_is_stored_as_deltas(
    client: AsyncClient, shared_database_url: str
) -> None:
    """LangGraph's messages channel holds the whole list at every version: each new
    version is stored as a delta of the parent's (at most 32 deep), so what is stored
    grows with the messages added, not with the list at every step; every version reads
    back whole. (Mirrored into the transcript, the channel is a small reference: the
    saver here keeps it plain, as a list that cannot be mirrored is.)"""
    saver = RunifoldSaver(client=client, mirror_messages=False)
    thread = str(uuid.uuid4())
    graph = build(saver, "x" * 600)
    for turn in range(12):
        await graph.ainvoke({"messages": [HumanMessage(f"turn {turn} " * 60)]}, config(thread))
    history = [t async for t in saver.alist(config(thread))]
    counts = [len(t.checkpoint["channel_values"].get("messages", [])) for t in history]
    assert counts[0] == 36 and counts == sorted(counts, reverse=True)
    async with await psycopg.AsyncConnection.connect(shared_database_url) as conn:
        cursor = await conn.execute(
            """SELECT sum(octet_length(b.blob)), sum(b.full_length),
                      count(*) FILTER (WHERE b.base_version IS NOT NULL), max(b.depth)
                 FROM transcript.checkpoint_blobs AS b
                 JOIN transcript.conversations AS c USING (conversation_key)
                WHERE c.conversation_id = %s AND b.channel = 'messages'""",
            (saver.conversation_id(thread),),
        )
        row = await cursor.fetchone()
    assert row is not None
    stored, whole, deltas, depth = row
    assert deltas > 0 and depth <= DELTA_MAX_DEPTH
    assert stored * 4 < whole, (stored, whole)


async def test_a_run_killed_mid_step_resumes_from_its_last_checkpoint(
    stack: Stack, saver: RunifoldSaver, namespace: str
) -> None:
    """A run SIGKILLed inside a step: its lease lapses (nobody renews it), the next run
    takes the thread and resumes from the last checkpoint (the step runs again), and
    nothing is duplicated: the input once, each step's message once."""
    thread = str(uuid.uuid4())
    peer = await _peer(stack, namespace, thread, "reject", "peer", "1")
    try:
        assert await _line(peer) == "holding"
        peer.kill()  # SIGKILL, inside the first step
        await peer.wait()
    finally:
        if peer.returncode is None:
            peer.kill()
            await peer.wait()
    resumed: list[Any] = []

    async def lapsed() -> bool:
        try:
            async with saver.athread_run(config(thread), multitask_strategy="reject") as fenced:
                resumed.append(await build(saver, "here").ainvoke(None, fenced))
        except ConversationBusy:
            return False
        return True

    await wait_for(lapsed, timeout=30.0)
    texts = [m.content for m in resumed[0]["messages"]]
    assert texts == ["hello", "here-1", "here-2"]


async def test_copy_thread_forks_the_transcript_and_may_be_repeated(
    saver: RunifoldSaver, client: AsyncClient
) -> None:
    source, target = str(uuid.uuid4()), f"copy-{uuid.uuid4().hex}"
    stored = await saver.aput(config(source), checkpoint({"k": "1"}, {"k": 1}), {}, {"k": 1})
    await client.append(saver.conversation_id(source), "said on the source")
    await saver.acopy_thread(source, target)
    forked = await client.get_conversation(saver.conversation_id(target))
    assert forked.fork_origin.conversation_id == saver.conversation_id(source)
    assert [e.message.text async for e in client.entries(forked.conversation_id)] == [
        "said on the source"
    ]
    await saver.acopy_thread(source, target)  # a repeat: the same fork, nothing more
    assert [t.checkpoint["channel_values"]["k"] async for t in saver.alist(config(target))] == ["1"]
    # The source goes on: the old copy is behind it (its transcript ends where the
    # source's did), so copying over it is refused; deleted, the target is copied anew.
    await client.append(saver.conversation_id(source), "later")
    await saver.aput(
        config(source, stored["configurable"]["checkpoint_id"]),
        checkpoint({"k": "2"}, {"k": 2}),
        {},
        {"k": 2},
    )
    with pytest.raises(ValueError, match="delete it first"):
        await saver.acopy_thread(source, target)
    await saver.adelete_thread(target)
    await saver.acopy_thread(source, target)
    copied = [t.checkpoint["channel_values"]["k"] async for t in saver.alist(config(target))]
    assert copied == ["2", "1"]
    assert [e.message.text async for e in client.entries(saver.conversation_id(target))] == [
        "said on the source",
        "later",
    ]
