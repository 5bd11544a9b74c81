"""RunifoldSession under the OpenAI Agents SDK: its Session contract (the behaviours the
SDK's own session tests state) and the SDK's real Runner end to end, against a real
all-in-one Runifold server on loopback with the fake OpenAI-compatible model server.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents import (
    Agent,
    RunConfig,
    RunContextWrapper,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.memory import SessionSettings
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from openai import AsyncOpenAI

from runifold_client import AsyncClient
from runifold_client.openai_agents import OfflineModel, RunifoldSession, SessionConflict
from tests.clients.python.session_peer import run_peer
from tests.support.fake_openai import FakeOpenAI, FakeReply, FakeToolCall, fake_openai
from tests.support.stack import Stack
from tests.support.waiting import wait_for

set_tracing_disabled(True)  # the SDK would export traces to the network otherwise


@pytest.fixture(scope="module")
async def model_server() -> AsyncIterator[FakeOpenAI]:
    async with fake_openai() as server:
        yield server


@pytest.fixture
async def client(stack: Stack, namespace: str) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(stack.address, namespace=namespace) as c:
        yield c


def session(client: AsyncClient, name: str | None = None, **kw: Any) -> RunifoldSession:
    return RunifoldSession(name or f"chat-{uuid.uuid4().hex[:8]}", client=client, **kw)


def agent(model_server: FakeOpenAI, **kw: Any) -> Agent[Any]:
    model = OpenAIChatCompletionsModel(
        "fake-model", AsyncOpenAI(base_url=model_server.base_url, api_key="test", max_retries=0)
    )
    return Agent(name="assistant", instructions="Be brief.", model=model, **kw)


ITEMS: list[Any] = [
    {"role": "user", "content": "Hello"},
    {
        "type": "message",
        "role": "assistant",
        "id": "msg_1",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Hi there!", "annotations": []}],
    },
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "think"}]},
    {
        "type": "function_call",
        "call_id": "call_a",
        "name": "weather",
        "arguments": '{"city": "Paris"}',
    },
    {"type": "function_call", "call_id": "call_b", "name": "weather", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_a", "output": "sunny, 21\u00b0C"},
    {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text"}]},
    {"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA"}]},
]


async def test_every_item_round_trips_exactly_in_order(client: AsyncClient) -> None:
    """Messages, reasoning, parallel function calls and their outputs, images: what
    get_items returns equals what was added, in order, also through another object."""
    one = session(client)
    await one.add_items(ITEMS[:3])
    await one.add_items(ITEMS[3:])
    assert await one.get_items() == ITEMS
    assert await session(client, one.session_id).get_items() == ITEMS
    entries = [e async for e in client.entries(one.conversation_id)]
    assert [e.message.role for e in entries][:2] == [1, 2]  # user, assistant
    assert "sunny" in entries[5].message.text  # the readable rendering summaries see


async def test_limits_return_the_latest_items_in_order(client: AsyncClient) -> None:
    s = session(client)
    items: list[Any] = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(6)
    ]
    await s.add_items(items)
    assert await s.get_items(limit=2) == items[-2:]
    assert await s.get_items(limit=4) == items[-4:]
    assert await s.get_items(limit=10) == items
    assert await s.get_items(limit=0) == []
    limited = session(client, s.session_id, session_settings=SessionSettings(limit=3))
    assert await limited.get_items() == items[-3:]
    assert await limited.get_items(limit=1) == items[-1:]


async def test_pop_item_is_a_recorded_retraction(client: AsyncClient) -> None:
    """pop_item returns the most recent item and get_items no longer has it, but the
    transcript keeps it: ListEntries shows it, retracted."""
    s = session(client)
    assert await s.pop_item() is None
    items: list[Any] = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there!"},
        {"role": "user", "content": "How are you?"},
    ]
    await s.add_items(items)
    assert await s.pop_item() == items[2]
    assert await s.get_items() == items[:2]
    assert await s.get_items(limit=2) == items[:2]  # the limit counts standing items
    assert await s.pop_item() == items[1]
    await s.add_items([{"role": "user", "content": "again"}])
    assert await s.get_items(limit=2) == [items[0], {"role": "user", "content": "again"}]
    entries = [e async for e in client.entries(s.conversation_id)]
    assert [json.loads(e.message.native_json) for e in entries] == [*items, entries_last(entries)]
    assert [bool(e.retracted_version) for e in entries] == [False, True, True, False]
    assert await s.pop_item() == {"role": "user", "content": "again"}
    assert await s.pop_item() == items[0]
    assert await s.pop_item() is None
    assert await s.get_items() == []


async def contents(s: RunifoldSession) -> list[Any]:
    items: list[Any] = await s.get_items()
    return [item["content"] for item in items]


def entries_last(entries: list[Any]) -> Any:
    return json.loads(entries[-1].message.native_json)


async def test_pop_only_touches_its_session(client: AsyncClient) -> None:
    one, two = session(client), session(client)
    await one.add_items([{"role": "user", "content": "one"}])
    await two.add_items(
        [{"role": "user", "content": "two 1"}, {"role": "user", "content": "two 2"}]
    )
    assert await two.pop_item() == {"role": "user", "content": "two 2"}
    assert await one.get_items() == [{"role": "user", "content": "one"}]


async def test_clear_session_erases_and_starts_afresh(client: AsyncClient) -> None:
    s = session(client)
    await s.add_items([{"role": "user", "content": "secret"}])
    await s.clear_session()
    assert await s.get_items() == []
    with pytest.raises(Exception, match="NOT_FOUND"):
        await client.get_conversation(s.conversation_id)
    await s.add_items([{"role": "user", "content": "fresh"}])
    assert await s.get_items() == [{"role": "user", "content": "fresh"}]


async def test_a_retried_add_stores_once(client: AsyncClient) -> None:
    """The same add at the same read version (a retry after a lost reply) replays."""
    s = session(client)
    await s.get_items()
    items: list[Any] = [{"role": "user", "content": "once"}]
    version = s._version
    await s.add_items(items)
    s._version = version  # as if the reply had been lost: the retry has the old version
    await s.add_items(items)
    assert await s.get_items() == items


async def test_a_stale_run_gets_a_conflict_not_an_interleaving(client: AsyncClient) -> None:
    """Two runs (each with its context, as the Runner hands it) that read the same
    version: the second run's add is refused whole and nothing of it lands; after
    reading again it succeeds."""
    first = session(client)
    await first.add_items([{"role": "user", "content": "start"}])
    second = session(client, first.session_id)
    run_a, run_b = RunContextWrapper(context=None), RunContextWrapper(context=None)
    await first.get_items(wrapper=run_a)
    await second.get_items(wrapper=run_b)
    await first.add_items(
        [{"role": "user", "content": "A1"}, {"role": "assistant", "content": "A2"}],
        wrapper=run_a,
    )
    with pytest.raises(SessionConflict) as conflict:
        await second.add_items([{"role": "user", "content": "B1"}], wrapper=run_b)
    assert conflict.value.current_version == 2
    assert await contents(first) == ["start", "A1", "A2"]
    await second.get_items(wrapper=run_b)
    await second.add_items([{"role": "user", "content": "B1"}], wrapper=run_b)
    assert await contents(first) == ["start", "A1", "A2", "B1"]


async def test_outside_a_run_a_second_writer_lands_after_the_first(client: AsyncClient) -> None:
    """Outside a run add_items appends as the SDK's own sessions do: a writer whose
    version is stale lands after the other's write, whole, never inside it."""
    first = session(client)
    await first.add_items([{"role": "user", "content": "start"}])
    second = session(client, first.session_id)
    await first.get_items()
    await second.get_items()
    await first.add_items(
        [{"role": "user", "content": "A1"}, {"role": "assistant", "content": "A2"}]
    )
    await second.add_items([{"role": "user", "content": "B1"}])
    assert await contents(first) == ["start", "A1", "A2", "B1"]


async def test_the_same_items_from_two_writers_at_one_version_are_two_writes(
    client: AsyncClient,
) -> None:
    """Two session objects that read one version add the same items: both report
    success and both copies are stored (the second is its own write, not a replay of
    the first); two runs of one object doing so: one lands, the other is refused,
    never both reported as one copy."""
    first = session(client)
    await first.add_items([{"role": "user", "content": "start"}])
    second = session(client, first.session_id)
    await first.get_items()
    await second.get_items()
    same: list[Any] = [{"role": "user", "content": "yes"}]
    await first.add_items(same)
    await second.add_items(same)
    assert await contents(first) == ["start", "yes", "yes"]

    # Two runs on one object (each run is a writer of its own).
    run_a, run_b = RunContextWrapper(context=None), RunContextWrapper(context=None)
    await first.get_items(wrapper=run_a)
    await first.get_items(wrapper=run_b)
    await first.add_items(same, wrapper=run_a)
    with pytest.raises(SessionConflict):
        await first.add_items(same, wrapper=run_b)
    assert await contents(first) == ["start", "yes", "yes", "yes"]


async def test_the_same_items_from_another_process_are_its_own_write(
    stack: Stack, client: AsyncClient, namespace: str
) -> None:
    """A second process reads the session and adds the same items this object adds at
    the version it read: both writes land."""
    mine = session(client)
    await mine.add_items([{"role": "user", "content": "start"}])
    await mine.get_items()
    same: list[Any] = [{"role": "user", "content": "same"}]
    await run_peer(stack.address, namespace, mine.session_id, "add", json.dumps(same))
    await mine.add_items(same)
    assert await contents(mine) == ["start", "same", "same"]


async def test_identical_adds_at_once_from_one_object_both_land(client: AsyncClient) -> None:
    """Two calls of one object running at once with the same items are two writes (a
    retry is a call made after the first ended)."""
    s = session(client)
    await s.add_items([{"role": "user", "content": "start"}])
    same: list[Any] = [{"role": "user", "content": "again"}]
    await asyncio.gather(s.add_items(same), s.add_items(same))
    assert await contents(s) == ["start", "again", "again"]


async def test_concurrent_adds_from_one_object_all_land(client: AsyncClient) -> None:
    """As the SDK's sessions: many adds at once through one object all succeed, each
    whole, none lost."""
    s = session(client)
    await s.get_items()
    sent = [f"m{i:02}" for i in range(25)]
    await asyncio.gather(*(s.add_items([{"role": "user", "content": c}]) for c in sent))
    assert sorted(await contents(s)) == sent


async def test_concurrent_pops_from_two_objects_return_each_item_once(
    client: AsyncClient,
) -> None:
    """Two session objects popping at once: each returns a different item, and both
    items are retracted."""
    writer = session(client)
    other = session(client, writer.session_id)
    await writer.add_items(
        [{"role": "user", "content": "first"}, {"role": "assistant", "content": "second"}]
    )
    popped: Any = await asyncio.gather(writer.pop_item(), other.pop_item())
    assert {item["content"] for item in popped if item is not None} == {"first", "second"}
    assert await writer.get_items() == []


async def test_pops_at_once_from_two_processes_return_each_item_once(
    stack: Stack, client: AsyncClient, namespace: str
) -> None:
    """This object reads the session and holds its pop's compare-and-swap while a
    second process pops: the second process retracts the last item, and this pop,
    losing the compare-and-swap, reads again and retracts the one before it. Both
    entries stay in the transcript, retracted."""
    mine = session(client)
    await mine.add_items(
        [{"role": "user", "content": "first"}, {"role": "assistant", "content": "second"}]
    )
    held, release = asyncio.Event(), asyncio.Event()
    original = client.append

    async def held_append(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("retract_sequences") and not held.is_set():
            held.set()
            await release.wait()
        return await original(*args, **kwargs)

    client.append = held_append  # type: ignore[method-assign]
    try:
        pop = asyncio.create_task(mine.pop_item())
        async with asyncio.timeout(60):  # a hang guard, not a threshold
            await held.wait()
        theirs = await run_peer(stack.address, namespace, mine.session_id, "pop")
        release.set()
        popped = await pop
    finally:
        release.set()
        client.append = original  # type: ignore[method-assign]
    assert theirs == {"role": "assistant", "content": "second"}
    assert popped == {"role": "user", "content": "first"}
    assert await mine.get_items() == []
    entries = [e async for e in client.entries(mine.conversation_id)]
    assert [bool(e.retracted_version) for e in entries] == [True, True]


async def test_a_retried_pop_returns_its_own_item(client: AsyncClient) -> None:
    """A pop's write retried by gRPC after a lost reply replays: the same item, once."""
    s = session(client)
    await s.add_items([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    original = client.append

    async def twice(*args: Any, **kwargs: Any) -> Any:
        await original(*args, **kwargs)  # the reply lost
        return await original(*args, **kwargs)

    client.append = twice  # type: ignore[method-assign]
    try:
        assert await s.pop_item() == {"role": "user", "content": "b"}
    finally:
        client.append = original  # type: ignore[method-assign]
    assert await s.get_items() == [{"role": "user", "content": "a"}]


# -- settings, and any event loop -----------------------------------------------------


async def test_settings_default_accept_a_dict_and_refuse_unknown_keys(
    client: AsyncClient,
) -> None:
    default = session(client)
    assert isinstance(default.session_settings, SessionSettings)
    assert default.session_settings.limit is None
    items: list[Any] = [{"role": "user", "content": f"m{i}"} for i in range(5)]
    await default.add_items(items)
    limited = session(client, default.session_id, session_settings={"limit": 2})
    assert isinstance(limited.session_settings, SessionSettings)
    assert await limited.get_items() == items[-2:]
    assert await limited.get_items(limit=3) == items[-3:]
    with pytest.raises(TypeError, match="limitt"):
        session(client, session_settings={"limitt": 2})


async def test_dict_settings_under_the_runner(
    client: AsyncClient, model_server: FakeOpenAI
) -> None:
    """The Runner reads a dict's limit as it reads SessionSettings'."""
    model_server.respond_with(lambda body: FakeReply(text="ok"))
    s = session(client, session_settings={"limit": 2})
    await s.add_items([{"role": "user", "content": f"old {i}"} for i in range(4)])
    result = await Runner.run(agent(model_server), "new", session=s)
    assert result.final_output == "ok"
    sent = model_server.chat_requests[-1].messages
    assert [m["content"] for m in sent if m["role"] == "user"] == ["old 2", "old 3", "new"]


async def test_a_run_configs_settings_override_the_sessions(client: AsyncClient) -> None:
    """As for the SDK's sessions: the run's RunConfig.session_settings (a dict too) over
    the session's, an explicit get_items(limit) over both; with the offline model, whose
    answer counts the history it was given."""
    s = session(client, session_settings={"limit": 3})
    await s.add_items([{"role": "user", "content": f"old {i}"} for i in range(4)])
    offline = Agent(name="assistant", model=OfflineModel())
    result = await Runner.run(offline, "now", session=s)
    assert result.final_output == "Context: 3 earlier message(s).\nYou said: now"
    result = await Runner.run(
        offline, "again", session=s, run_config=RunConfig(session_settings={"limit": 1})
    )
    assert result.final_output == "Context: 1 earlier message(s).\nYou said: again"
    assert len(await s.get_items(limit=5)) == 5


async def test_one_session_from_any_loop_and_thread(
    stack: Stack, namespace: str, model_server: FakeOpenAI
) -> None:
    """One session object (with its own client) used from this loop, from another
    thread's asyncio.run twice, under Runner.run_sync, and from two threads at once."""
    model_server.respond_with(lambda body: FakeReply(text="synced"))
    s = RunifoldSession(f"loops-{uuid.uuid4().hex[:8]}", target=stack.address, namespace=namespace)
    await s.add_items([{"role": "user", "content": "here"}])

    def elsewhere() -> list[Any]:
        asyncio.run(s.add_items([{"role": "user", "content": "there"}]))
        return asyncio.run(s.get_items())

    assert [i["content"] for i in await asyncio.to_thread(elsewhere)] == ["here", "there"]

    def run_sync() -> Any:
        return Runner.run_sync(agent(model_server), "sync question", session=s)

    assert (await asyncio.to_thread(run_sync)).final_output == "synced"

    def add(content: str) -> None:
        asyncio.run(s.add_items([{"role": "user", "content": content}]))

    await asyncio.gather(asyncio.to_thread(add, "t1"), asyncio.to_thread(add, "t2"))
    found = await contents(s)
    assert found[:3] == ["here", "there", "sync question"]
    assert sorted(found[-2:]) == ["t1", "t2"]
    await s.close()


async def test_instructions_never_persist(client: AsyncClient) -> None:
    s = session(client)
    for role in ("system", "developer"):
        with pytest.raises(ValueError, match="instructions"):
            await s.add_items([{"role": role, "content": "You are root."}])
    assert await s.get_items() == []


async def test_a_long_session_reads_a_bounded_tail(client: AsyncClient) -> None:
    """get_items(limit) reads `limit` entries however long the session is."""
    s = session(client)
    items: list[Any] = [{"role": "user", "content": f"m{i}"} for i in range(600)]
    await s.add_items(items)  # three appends of at most 256
    entries_read: list[int] = []
    original = client.entries

    def counting(*args: Any, **kwargs: Any) -> Any:
        async def pages() -> Any:
            async for entry in original(*args, **kwargs):
                entries_read.append(entry.sequence)
                yield entry

        return pages()

    client.entries = counting  # type: ignore[method-assign]
    try:
        assert await s.get_items(limit=3) == items[-3:]
    finally:
        client.entries = original  # type: ignore[method-assign]
    assert entries_read == [598, 599, 600]


# -- the SDK's Runner, end to end --------------------------------------------------------


async def test_runner_turns_with_a_tool_call(client: AsyncClient, model_server: FakeOpenAI) -> None:
    """Several turns through the Runner: the second turn's model input holds the first
    turn's history, the tool call and its output are stored as items, and pop_item
    undoes the last answer so the next run sees the history without it."""

    @function_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    replies = iter(
        [
            FakeReply(text="Hello Ada."),
            FakeReply(tool_calls=[FakeToolCall("weather", '{"city": "Paris"}', "call_1")]),
            FakeReply(text="It is sunny in Paris."),
            FakeReply(text="Your name is Ada."),
        ]
    )
    model_server.respond_with(lambda body: next(replies))
    s = session(client)
    bot = agent(model_server, tools=[weather])
    first = await Runner.run(bot, "My name is Ada.", session=s)
    assert first.final_output == "Hello Ada."
    second = await Runner.run(bot, "Weather in Paris?", session=s)
    assert second.final_output == "It is sunny in Paris."
    sent = model_server.chat_requests[-1].messages
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user", "assistant", "tool"]
    assert sent[-1]["content"] == "sunny in Paris"
    items = await s.get_items()
    kinds = [i.get("type", "message") for i in items]
    assert "function_call" in kinds and "function_call_output" in kinds
    assert items[0] == {"content": "My name is Ada.", "role": "user"}
    popped: Any = await s.pop_item()
    assert popped is not None and popped["content"][0]["text"] == "It is sunny in Paris."
    third = await Runner.run(bot, "What is my name?", session=s)
    assert third.final_output == "Your name is Ada."
    sent = model_server.chat_requests[-1].messages
    assert all("sunny in Paris." not in str(m.get("content")) for m in sent)
    assert sent[1]["content"] == "My name is Ada."


async def test_a_concurrent_second_run_is_refused_not_interleaved(
    client: AsyncClient, model_server: FakeOpenAI
) -> None:
    """Two runs on one session object at once, the first's model call held open while
    the second runs whole: the first, whose read is stale by then, saves none of its
    output and raises SessionConflict; the second run's turn is whole, nothing of the
    first's answer is in the session."""
    release = asyncio.Event()
    base = len(model_server.chat_requests)

    async def respond(body: Any) -> FakeReply:
        if len(model_server.chat_requests) == base + 1:
            await release.wait()
            return FakeReply(text="first answer")
        return FakeReply(text="second answer")

    model_server.respond_with(respond)
    s = session(client)
    bot = agent(model_server)
    config = RunConfig(tracing_disabled=True)
    first = asyncio.create_task(Runner.run(bot, "first question", session=s, run_config=config))

    async def first_is_in_its_model_call() -> bool:
        return len(model_server.chat_requests) > base

    try:
        await wait_for(first_is_in_its_model_call, timeout=30)
        second = await Runner.run(bot, "second question", session=s, run_config=config)
    finally:
        release.set()
    assert second.final_output == "second answer"
    with pytest.raises(SessionConflict):
        await first
    contents = [str(i.get("content")) for i in await s.get_items()]
    assert "second answer" in contents[-1] and contents[-2] == "second question"
    assert not any("first answer" in c for c in contents)


def _texts(items: list[Any]) -> list[str]:
    said = []
    for item in items:
        content = item.get("content")
        said.append(content if isinstance(content, str) else content[0]["text"])
    return said


async def test_branch_from_a_turn_regenerates_on_a_fork(client: AsyncClient) -> None:
    """The SDK's branching (AdvancedSQLiteSession.create_branch_from_turn) as Runifold
    forks: a branch holds the items before a user message, shared, not copied; the
    Runner runs the edited message on it; the session branched from is unchanged, a
    popped item stays popped, a named branch is made once, and clearing the session
    clears its branches."""
    offline = Agent(name="assistant", model=OfflineModel())
    s = session(client)
    await Runner.run(offline, "Name a colour.", session=s)
    await s.add_items([{"role": "user", "content": "oops"}])
    assert await s.pop_item() == {"role": "user", "content": "oops"}
    await Runner.run(offline, "Another one?", session=s)
    before: list[Any] = await s.get_items()
    assert len(before) == 4
    turns = await s.get_conversation_turns()
    assert [(t["turn"], t["content"], t["sequence"]) for t in turns] == [
        (1, "Name a colour.", 1),
        (2, "Another one?", 4),  # after the popped item's entry
    ]

    branch = await s.branch_from_turn(2, session_id="colour-warmer")
    assert await branch.get_items() == before[:2]
    await Runner.run(offline, "A warmer one?", session=branch)
    regenerated = await branch.get_items()
    assert _texts(regenerated)[:3] == [
        "Name a colour.",
        before[1]["content"][0]["text"],
        "A warmer one?",
    ]
    assert len(regenerated) == 4
    assert await s.get_items() == before  # the session branched from is unchanged
    conversation = await client.get_conversation(branch.conversation_id)
    assert conversation.fork_origin.conversation_id == s.conversation_id
    assert conversation.fork_origin.through_sequence == 3  # the popped entry is shared, popped
    # A named branch is made once: the retry returns it.
    again = await s.branch_from_turn(2, session_id="colour-warmer")
    assert again.conversation_id == branch.conversation_id
    assert len(await again.get_items()) == 4

    first_only = await s.fork(through_item=1)
    assert await first_only.get_items() == before[:1]
    empty = await s.fork(through_item=0)
    assert await empty.get_items() == []
    with pytest.raises(ValueError):
        await s.branch_from_turn(3)
    with pytest.raises(ValueError):
        await s.fork(through_item=5)
    assert await s.branches() == [
        branch.conversation_id,
        first_only.conversation_id,
        empty.conversation_id,
    ]
    # A branch of a branch is the branch's, not the session's.
    nested = await branch.branch_from_turn(2)
    assert await nested.get_items() == before[:2]
    assert await branch.branches() == [nested.conversation_id]

    await s.clear_session()
    for gone in (branch, first_only, nested):
        assert await gone.get_items() == []


async def test_a_branch_from_a_turn_inside_one_append(client: AsyncClient) -> None:
    """Items added at once are one append: a branch before a user message among them
    forks inside it, and keeps the items before that message."""
    s = session(client)
    items: list[Any] = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "two"},
    ]
    await s.add_items(items)
    branch = await s.branch_from_turn(2)
    assert await branch.get_items() == items[:2]
    await branch.add_items([{"role": "user", "content": "second, edited"}])
    assert _texts(await branch.get_items()) == ["first", "one", "second, edited"]
    assert await s.get_items() == items
