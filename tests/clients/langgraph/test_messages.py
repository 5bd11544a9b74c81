"""A LangGraph messages channel mirrored into the thread's transcript and stored once
(runifold_client.langgraph.messages), on a real all-in-one server: a MessagesState
graph with a fake chat model runs turns on RunifoldSaver, and the transcript, the
checkpoints and PostgreSQL's tables are read back."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import psycopg
import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph

from runifold.common.v1 import common_pb2
from runifold_client import AsyncClient
from runifold_client.langgraph import RunifoldSaver
from runifold_client.langgraph.messages import REFERENCE_TYPE
from tests.support.stack import Stack


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(stack.address, namespace=f"lgm-{uuid.uuid4().hex[:10]}") as c:
        yield c


def chat_graph(saver: RunifoldSaver) -> CompiledStateGraph:
    """One node: the fake chat model answers the whole history."""
    model = FakeListChatModel(responses=[f"answer {i}" for i in range(200)])

    async def chat(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("chat", chat)
    builder.add_edge(START, "chat")
    builder.add_edge("chat", END)
    return builder.compile(checkpointer=saver)


async def run_turns(
    graph: CompiledStateGraph, thread: str, turns: int, start: int = 0
) -> list[BaseMessage]:
    config = {"configurable": {"thread_id": thread}}
    result: dict[str, list[BaseMessage]] = {}
    for turn in range(start, start + turns):
        result = await graph.ainvoke({"messages": [HumanMessage(f"question {turn}")]}, config)
    return list(result["messages"])


async def entries(client: AsyncClient, thread: str) -> list[common_pb2.Entry]:
    return [e async for e in client.entries(RunifoldSaver.conversation_id(thread))]


async def test_each_message_is_one_entry_in_order_and_state_reads_back_exactly(
    client: AsyncClient,
) -> None:
    saver = RunifoldSaver(client=client)
    thread = f"t-{uuid.uuid4().hex}"
    messages = await run_turns(chat_graph(saver), thread, 5)

    stored = await entries(client, thread)
    assert [(e.message.role, e.message.text) for e in stored] == [
        pair
        for turn in range(5)
        for pair in (
            (common_pb2.ROLE_USER, f"question {turn}"),
            (common_pb2.ROLE_ASSISTANT, f"answer {turn}"),
        )
    ]
    ids = [json.loads(e.message.native_json)["kwargs"]["id"] for e in stored]
    assert ids == [m.id for m in messages]
    # A new saver (no cache) reads the checkpoint back: the exact messages.
    fresh = RunifoldSaver(client=client)
    state = await chat_graph(fresh).aget_state({"configurable": {"thread_id": thread}})
    assert state.values["messages"] == messages
    assert [type(m) for m in state.values["messages"]] == [type(m) for m in messages]
    # The channel's version is stored as a reference, not the list.
    found = await client.get_checkpoint(RunifoldSaver.conversation_id(thread))
    assert found is not None
    [value] = [v for v in found.channel_values if v.channel == "messages"]
    assert value.value.type == REFERENCE_TYPE
    assert value.value.value == b'{"ranges": [[1, 10]]}'


async def test_a_removed_message_is_retracted_and_older_checkpoints_read_their_list(
    client: AsyncClient,
) -> None:
    saver = RunifoldSaver(client=client)
    graph = chat_graph(saver)
    thread = f"t-{uuid.uuid4().hex}"
    config = {"configurable": {"thread_id": thread}}
    before = await run_turns(graph, thread, 3)

    await graph.aupdate_state(config, {"messages": [RemoveMessage(id=before[2].id)]})

    state = await graph.aget_state(config)
    assert state.values["messages"] == before[:2] + before[3:]
    stored = await entries(client, thread)
    assert len(stored) == 6  # nothing appended, one entry retracted
    assert [e.sequence for e in stored if e.retracted_version] == [3]
    # The checkpoint before the removal still reads its whole list (the retracted
    # entry keeps its content), from a saver that never saw the thread.
    fresh = chat_graph(RunifoldSaver(client=client))
    history = [s async for s in fresh.aget_state_history(config)]
    assert history[1].values["messages"] == before
    # The next turn goes on without the removed message.
    after = await run_turns(graph, thread, 1, start=3)
    assert after[:5] == before[:2] + before[3:]
    assert [e.message.text for e in (await entries(client, thread))[6:]] == [
        "question 3",
        "answer 3",
    ]


async def test_time_travel_resumes_from_an_older_checkpoint(client: AsyncClient) -> None:
    saver = RunifoldSaver(client=client)
    graph = chat_graph(saver)
    thread = f"t-{uuid.uuid4().hex}"
    config = {"configurable": {"thread_id": thread}}
    messages = await run_turns(graph, thread, 3)
    history = [s async for s in graph.aget_state_history(config)]
    # The checkpoint after the first turn: two messages.
    [first] = [s for s in history if len(s.values.get("messages", [])) == 2 and not s.next]

    resumed = await graph.ainvoke({"messages": [HumanMessage("another question")]}, first.config)

    assert resumed["messages"][:2] == messages[:2]
    assert [m.content for m in resumed["messages"][2:]] == ["another question", "answer 3"]
    fresh = chat_graph(RunifoldSaver(client=client))
    assert (await fresh.aget_state(config)).values["messages"] == resumed["messages"]
    # The abandoned branch still reads right.
    assert (await fresh.aget_state(history[0].config)).values["messages"] == messages


async def test_a_watch_on_the_thread_sees_the_new_messages(client: AsyncClient) -> None:
    saver = RunifoldSaver(client=client)
    graph = chat_graph(saver)
    thread = f"t-{uuid.uuid4().hex}"
    await run_turns(graph, thread, 1)
    seen: list[str] = []

    async def watch() -> None:
        async for event in client.watch_conversation(
            RunifoldSaver.conversation_id(thread), after_sequence=2
        ):
            if event.HasField("appended"):
                seen.extend(e.message.text for e in event.appended.entries)
                if len(seen) >= 2:
                    return

    watching = asyncio.create_task(watch())
    await run_turns(graph, thread, 1, start=1)
    await asyncio.wait_for(watching, timeout=30)
    assert seen == ["question 1", "answer 1"]


async def test_a_retried_put_appends_nothing_twice(client: AsyncClient) -> None:
    thread = f"t-{uuid.uuid4().hex}"
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {
        "messages": [HumanMessage("hello", id="m1"), AIMessage("hi", id="m2")]
    }
    checkpoint["channel_versions"] = {"messages": 1}

    await RunifoldSaver(client=client).aput(config, checkpoint, {}, {"messages": 1})
    # The same put again, from the same saver and from another process's saver.
    saver = RunifoldSaver(client=client)
    await saver.aput(config, checkpoint, {}, {"messages": 1})
    await saver.aput(config, checkpoint, {}, {"messages": 1})

    assert [e.message.text for e in await entries(client, thread)] == ["hello", "hi"]
    got = await saver.aget_tuple({"configurable": {"thread_id": thread}})
    assert got is not None
    assert got.checkpoint["channel_values"]["messages"] == checkpoint["channel_values"]["messages"]


async def test_a_system_message_keeps_the_plain_blob_exactly(client: AsyncClient) -> None:
    saver = RunifoldSaver(client=client)
    graph = chat_graph(saver)
    thread = f"t-{uuid.uuid4().hex}"
    config = {"configurable": {"thread_id": thread}}
    result = await graph.ainvoke(
        {"messages": [SystemMessage("be brief"), HumanMessage("question")]}, config
    )

    state = await chat_graph(RunifoldSaver(client=client)).aget_state(config)
    assert state.values["messages"] == result["messages"]
    assert await entries(client, thread) == []


async def messages_bytes(database_url: str, thread: str) -> tuple[int, int]:
    """Rows and bytes the messages channel's versions take in the checkpoint tables."""
    async with await psycopg.AsyncConnection.connect(database_url) as connection:
        cursor = await connection.execute(
            """SELECT count(*), coalesce(sum(octet_length(b.blob)), 0)
                 FROM transcript.checkpoint_blobs AS b
                 JOIN transcript.conversations AS c USING (conversation_key)
                WHERE c.conversation_id = %s AND b.channel = 'messages'""",
            (RunifoldSaver.conversation_id(thread),),
        )
        row = await cursor.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


async def test_the_messages_channel_grows_linearly_with_the_turns(
    client: AsyncClient, shared_database_url: str
) -> None:
    graph = chat_graph(RunifoldSaver(client=client))
    thread = f"t-{uuid.uuid4().hex}"
    await run_turns(graph, thread, 10)
    rows_10, bytes_10 = await messages_bytes(shared_database_url, thread)
    await run_turns(graph, thread, 30, start=10)
    rows_40, bytes_40 = await messages_bytes(shared_database_url, thread)

    # Two versions a turn (the input, the answer), each a reference of one range: bytes
    # grow with the turns (4x), not with their square (16x when stored whole).
    assert rows_40 == 4 * rows_10
    assert bytes_40 <= 5 * bytes_10
    assert bytes_40 <= 40 * rows_40


async def test_a_tool_exchange_is_mirrored_with_its_calls(client: AsyncClient) -> None:
    thread = f"t-{uuid.uuid4().hex}"
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    listed = [
        HumanMessage("weather in Paris?", id="h1"),
        AIMessage(
            "",
            id="a1",
            tool_calls=[{"name": "weather", "args": {"city": "Paris"}, "id": "call-1"}],
        ),
        ToolMessage("18 C, sunny", tool_call_id="call-1", id="t1", name="weather"),
        AIMessage("18 C and sunny.", id="a2"),
    ]
    checkpoint["channel_values"] = {"messages": listed}
    checkpoint["channel_versions"] = {"messages": "1"}

    await RunifoldSaver(client=client).aput(config, checkpoint, {}, {"messages": "1"})

    stored = await entries(client, thread)
    assert [e.message.role for e in stored] == [
        common_pb2.ROLE_USER,
        common_pb2.ROLE_ASSISTANT,
        common_pb2.ROLE_TOOL,
        common_pb2.ROLE_ASSISTANT,
    ]
    [call] = stored[1].message.tool_calls
    assert (call.id, call.name, json.loads(call.arguments_json)) == (
        "call-1",
        "weather",
        {"city": "Paris"},
    )
    assert stored[2].message.tool_call_id == "call-1"
    got = await RunifoldSaver(client=client).aget_tuple({"configurable": {"thread_id": thread}})
    assert got is not None
    assert got.checkpoint["channel_values"]["messages"] == listed


async def test_more_messages_than_one_append_holds(client: AsyncClient) -> None:
    """A first put of a long history (an imported thread): appended in chunks of 256,
    referenced as one range, read back exactly."""
    thread = f"t-{uuid.uuid4().hex}"
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    listed: list[BaseMessage] = [
        HumanMessage(f"q{i}", id=f"h{i}") if i % 2 == 0 else AIMessage(f"a{i}", id=f"a{i}")
        for i in range(300)
    ]
    checkpoint["channel_values"] = {"messages": listed}
    checkpoint["channel_versions"] = {"messages": "1"}

    await RunifoldSaver(client=client).aput(config, checkpoint, {}, {"messages": "1"})

    assert len(await entries(client, thread)) == 300
    found = await client.get_checkpoint(RunifoldSaver.conversation_id(thread))
    assert found is not None
    [value] = [v for v in found.channel_values if v.channel == "messages"]
    assert value.value.value == b'{"ranges": [[1, 300]]}'
    got = await RunifoldSaver(client=client).aget_tuple({"configurable": {"thread_id": thread}})
    assert got is not None
    assert got.checkpoint["channel_values"]["messages"] == listed


async def test_the_sync_methods_mirror_too(stack: Stack) -> None:
    """graph.invoke (the saver's sync methods, on its own loop) mirrors as ainvoke does."""
    namespace = f"lgm-{uuid.uuid4().hex[:10]}"
    saver = RunifoldSaver(target=stack.address, namespace=namespace)
    thread = f"t-{uuid.uuid4().hex}"
    model = FakeListChatModel(responses=["one", "two"])

    def chat(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("chat", chat)
    builder.add_edge(START, "chat")
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": thread}}

    def run() -> list[BaseMessage]:
        graph.invoke({"messages": [HumanMessage("first")]}, config)
        return list(graph.invoke({"messages": [HumanMessage("second")]}, config)["messages"])

    try:
        messages = await asyncio.to_thread(run)
        assert await asyncio.to_thread(lambda: graph.get_state(config).values["messages"]) == (
            messages
        )
    finally:
        await asyncio.to_thread(saver.close)
    async with AsyncClient(stack.address, namespace=namespace) as client:
        stored = await entries(client, thread)
    assert [e.message.text for e in stored] == ["first", "one", "second", "two"]


async def test_a_leased_run_is_mirrored_when_it_ends_and_later_puts_reference_again(
    client: AsyncClient,
) -> None:
    """Under thread_run the puts keep the channel plain (an append cannot commit under the
    lease without ending it); the run's messages are appended when it releases the lease,
    and the next put outside a lease finds them by id: a reference again, nothing twice."""
    saver = RunifoldSaver(client=client)
    graph = chat_graph(saver)
    thread = f"t-{uuid.uuid4().hex}"
    config = {"configurable": {"thread_id": thread}}
    for turn in range(2):
        async with saver.athread_run(config, multitask_strategy="reject") as fenced:
            await graph.ainvoke({"messages": [HumanMessage(f"question {turn}")]}, fenced)
    assert [e.message.text for e in await entries(client, thread)] == [
        "question 0",
        "answer 0",
        "question 1",
        "answer 1",
    ]

    messages = await run_turns(chat_graph(RunifoldSaver(client=client)), thread, 1, start=2)

    stored = await entries(client, thread)
    assert [e.message.text for e in stored] == [m.content for m in messages]
    found = await client.get_checkpoint(RunifoldSaver.conversation_id(thread))
    assert found is not None
    [value] = [v for v in found.channel_values if v.channel == "messages"]
    assert value.value.value == b'{"ranges": [[1, 6]]}'
    state = await chat_graph(RunifoldSaver(client=client)).aget_state(config)
    assert state.values["messages"] == messages
