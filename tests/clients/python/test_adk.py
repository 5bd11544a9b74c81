"""RunifoldSessionService and RunifoldMemoryService under Google ADK: the session
contract as ADK's own session tests state it (tests/unittests/sessions of google/adk-python),
the compare-and-swap behind StaleSessionError, bounded loads, and ADK's real Runner end
to end with an offline model, against a real all-in-one Runifold server on loopback.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.tools.tool_context import ToolContext
from google.genai import types

from runifold_client import AsyncClient
from runifold_client.adk import RunifoldMemoryService, RunifoldSessionService, event_to_message
from runifold_client.errors import InvalidArgument
from tests.support.stack import Stack
from tests.support.waiting import wait_for


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(stack.address) as c:
        yield c


@pytest.fixture
def service(client: AsyncClient) -> RunifoldSessionService:
    return RunifoldSessionService(client=client)


@pytest.fixture
def app() -> str:
    """An app name of its own per test (each app is a namespace)."""
    return f"app-{uuid.uuid4().hex[:10]}"


async def test_create_get_delete(service: RunifoldSessionService, app: str) -> None:
    assert await service.get_session(app_name=app, user_id="u", session_id="123") is None
    session = await service.create_session(app_name=app, user_id="u", state={"key": "value"})
    assert session.id and session.state == {"key": "value"}
    got = await service.get_session(app_name=app, user_id="u", session_id=session.id)
    assert got == session
    with pytest.raises(AlreadyExistsError):
        await service.create_session(app_name=app, user_id="u", session_id=session.id)
    await service.delete_session(app_name=app, user_id="u", session_id=session.id)
    assert await service.get_session(app_name=app, user_id="u", session_id=session.id) is None


async def test_sessions_are_scoped_by_app_and_user(
    service: RunifoldSessionService, app: str
) -> None:
    """The same session id under two users names two sessions; get_session keys by all three."""
    mine = await service.create_session(app_name=app, user_id="u1", session_id="s1")
    await service.append_event(mine, Event(invocation_id="inv1", author="user"))
    await service.create_session(app_name=app, user_id="u2", session_id="s1")
    theirs = await service.get_session(app_name=app, user_id="u2", session_id="s1")
    assert theirs is not None and theirs.user_id == "u2" and theirs.events == []
    other_app = await service.get_session(app_name=app + "x", user_id="u1", session_id="s1")
    assert other_app is None


async def test_list_sessions_by_user_and_all_with_merged_state(
    service: RunifoldSessionService, app: str
) -> None:
    for user, sid in (("u1", "a"), ("u1", "b"), ("u2", "c")):
        await service.create_session(app_name=app, user_id=user, session_id=sid, state={"k": sid})
    one = (await service.list_sessions(app_name=app, user_id="u1")).sessions
    assert {s.id: s.state for s in one} == {"a": {"k": "a"}, "b": {"k": "b"}}
    every = (await service.list_sessions(app_name=app)).sessions
    assert [s.id for s in every] == ["a", "b", "c"]  # oldest update first
    assert all(s.events == [] for s in every)
    session = await service.get_session(app_name=app, user_id="u1", session_id="a")
    assert session is not None
    await service.append_event(
        session, Event(author="user", timestamp=session.last_update_time + 9)
    )
    every = (await service.list_sessions(app_name=app)).sessions
    assert [s.id for s in every] == ["b", "c", "a"]


async def test_state_prefixes(service: RunifoldSessionService, app: str) -> None:
    """app: shared by every user of the app, user: by the user's sessions, plain keys by
    the session alone, temp: never persisted (but visible in the live session); a dict
    value replaces the stored one whole, None is stored."""
    s1 = await service.create_session(
        app_name=app, user_id="u1", session_id="s1", state={"app:k1": "v1", "user:p": {"a": 1}}
    )
    event = Event(
        invocation_id="inv1",
        author="user",
        actions=EventActions(
            state_delta={"app:k2": "v2", "user:p": {"b": 2}, "sk": None, "temp:t": "x"}
        ),
    )
    await service.append_event(s1, event)
    assert s1.state["temp:t"] == "x" and "temp:t" not in event.actions.state_delta
    s1b = await service.create_session(app_name=app, user_id="u1", session_id="s1b")
    assert s1b.state == {"app:k1": "v1", "app:k2": "v2", "user:p": {"b": 2}}
    s2 = await service.create_session(app_name=app, user_id="u2", session_id="s2")
    assert s2.state == {"app:k1": "v1", "app:k2": "v2"}
    got = await service.get_session(app_name=app, user_id="u1", session_id="s1")
    assert got is not None
    assert got.state == {"app:k1": "v1", "app:k2": "v2", "user:p": {"b": 2}, "sk": None}
    assert "temp:t" not in got.events[0].actions.state_delta
    assert await service.get_user_state(app_name=app, user_id="u1") == {"p": {"b": 2}}
    assert await service.get_user_state(app_name=app, user_id="u3") == {}
    assert await service.get_user_state(app_name=app + "x", user_id="u1") == {}


async def test_events_round_trip_exactly_with_their_timestamps(
    service: RunifoldSessionService, app: str
) -> None:
    session = await service.create_session(app_name=app, user_id="u")
    event = Event(
        invocation_id="invocation",
        author="user",
        content=types.Content(
            role="user",
            parts=[
                types.Part(text="test_text"),
                types.Part.from_bytes(data=b"\x89PNG", mime_type="image/png"),
            ],
        ),
        turn_complete=True,
        actions=EventActions(artifact_delta={"file": 0}, transfer_to_agent="agent", escalate=True),
        long_running_tool_ids={"tool1"},
        error_code="error_code",
        interrupted=True,
        usage_metadata=types.GenerateContentResponseUsageMetadata(
            prompt_token_count=1, candidates_token_count=1, total_token_count=2
        ),
        custom_metadata={"custom_key": "custom_value"},
        timestamp=1700000000.123,
    )
    await service.append_event(session, event)
    assert session.last_update_time == 1700000000.123
    got = await service.get_session(app_name=app, user_id="u", session_id=session.id)
    assert got == session
    assert got is not None and got.last_update_time == 1700000000.123


async def test_partial_events_are_not_persisted(service: RunifoldSessionService, app: str) -> None:
    session = await service.create_session(app_name=app, user_id="u")
    await service.append_event(session, Event(author="user", partial=True))
    got = await service.get_session(app_name=app, user_id="u", session_id=session.id)
    assert session.events == [] and got is not None and got.events == []
    assert got.last_update_time == session.last_update_time


async def test_recent_events_and_after_timestamp(service: RunifoldSessionService, app: str) -> None:
    session = await service.create_session(app_name=app, user_id="u")
    for i in range(1, 6):
        await service.append_event(session, Event(author="user", timestamp=i))

    async def stamps(**config: Any) -> list[float]:
        got = await service.get_session(
            app_name=app, user_id="u", session_id=session.id, config=GetSessionConfig(**config)
        )
        assert got is not None
        return [e.timestamp for e in got.events]

    assert await stamps() == [1, 2, 3, 4, 5]
    assert await stamps(num_recent_events=0) == []
    assert await stamps(num_recent_events=3) == [3, 4, 5]
    assert await stamps(after_timestamp=4.0) == [4, 5]
    assert await stamps(after_timestamp=50) == []
    assert await stamps(after_timestamp=2.0, num_recent_events=2) == [4, 5]
    assert await stamps(after_timestamp=4.0, num_recent_events=3) == [4, 5]


async def test_a_stale_session_is_refused_and_stores_nothing(
    service: RunifoldSessionService, app: str
) -> None:
    original = await service.create_session(app_name=app, user_id="u")
    first = Event(invocation_id="inv1", author="user", actions=EventActions(state_delta={"a": 1}))
    await service.append_event(original, first)
    updated = await service.get_session(app_name=app, user_id="u", session_id=original.id)
    assert updated is not None
    await service.append_event(
        updated,
        Event(invocation_id="inv2", author="user", actions=EventActions(state_delta={"b": 2})),
    )
    stale = Event(
        invocation_id="inv3", author="user", actions=EventActions(state_delta={"c": 3, "user:x": 1})
    )
    with pytest.raises(StaleSessionError, match="modified in storage"):
        await service.append_event(original, stale)
    final = await service.get_session(app_name=app, user_id="u", session_id=original.id)
    assert final is not None
    assert [e.invocation_id for e in final.events] == ["inv1", "inv2"]
    assert final.state == {"a": 1, "b": 2}


async def test_an_event_delivered_again_is_stored_once(
    service: RunifoldSessionService, app: str
) -> None:
    """An event's id is its idempotency key: appended again to the same session object,
    through a session loaded after it, or retried after a lost reply, it is stored (and
    its state change applied) once; the session goes on. Another event under that id is
    refused, as ADK's database service refuses it."""
    session = await service.create_session(app_name=app, user_id="u")
    event = Event(
        invocation_id="inv1",
        author="user",
        content=types.Content(role="user", parts=[types.Part(text="once")]),
        actions=EventActions(state_delta={"n": 1, "user:seen": True}),
    )
    await service.append_event(session, event)
    await service.append_event(session, event)
    assert [e.id for e in session.events] == [event.id]
    loaded = await service.get_session(app_name=app, user_id="u", session_id=session.id)
    assert loaded is not None
    await service.append_event(loaded, event)
    assert [e.id for e in loaded.events] == [event.id]

    # A retry whose first reply was lost: the session object never heard of the event.
    before = await service.get_session(app_name=app, user_id="u", session_id=session.id)
    assert before is not None
    retried = Event(invocation_id="inv2", author="user", actions=EventActions(state_delta={"m": 2}))
    await service.append_event(before.model_copy(deep=True), retried)
    await service.append_event(before, retried)
    assert [e.id for e in before.events] == [event.id, retried.id]
    await service.append_event(before, Event(invocation_id="inv3", author="user"))

    with pytest.raises(InvalidArgument, match="different payload"):
        await service.append_event(before, Event(id=event.id, invocation_id="inv4", author="user"))
    final = await service.get_session(app_name=app, user_id="u", session_id=session.id)
    assert final is not None
    assert [e.invocation_id for e in final.events] == ["inv1", "inv2", "inv3"]
    assert final.state == {"n": 1, "m": 2, "user:seen": True}


async def test_ten_concurrent_writers_from_separate_services(client: AsyncClient, app: str) -> None:
    """Ten service instances append to one session loaded at one version, round after
    round: exactly one wins each version, the others get StaleSessionError, and nothing
    of a loser is stored (every event and state key of the session is a winner's)."""
    services = [RunifoldSessionService(client=client) for _ in range(10)]
    created = await services[0].create_session(app_name=app, user_id="u")
    winners = []
    for round_ in range(3):
        loaded = await services[0].get_session(app_name=app, user_id="u", session_id=created.id)
        assert loaded is not None
        copies = [loaded.model_copy(deep=True) for _ in services]
        events = [
            Event(
                invocation_id=f"r{round_}w{i}",
                author="user",
                actions=EventActions(state_delta={f"r{round_}": i}),
            )
            for i in range(10)
        ]
        results = await asyncio.gather(
            *(s.append_event(c, e) for s, c, e in zip(services, copies, events, strict=True)),
            return_exceptions=True,
        )
        won = [i for i, r in enumerate(results) if not isinstance(r, BaseException)]
        assert len(won) == 1
        assert all(
            isinstance(r, StaleSessionError) for r in results if isinstance(r, BaseException)
        )
        winners.append(won[0])
    final = await services[0].get_session(app_name=app, user_id="u", session_id=created.id)
    assert final is not None
    assert [e.invocation_id for e in final.events] == [f"r{r}w{w}" for r, w in enumerate(winners)]
    assert final.state == {f"r{r}": w for r, w in enumerate(winners)}


async def test_apps_stay_apart_in_one_namespace(client: AsyncClient, namespace: str) -> None:
    """With a fixed namespace every app lives in it, with its own app and user state."""
    service = RunifoldSessionService(client=client, namespace=namespace)
    a = await service.create_session(app_name="a", user_id="u", state={"app:k": "A", "user:k": 1})
    b = await service.create_session(app_name="b", user_id="u", session_id=a.id)
    assert b.state == {}
    assert (await service.get_session(app_name="a", user_id="u", session_id=a.id)) == a
    assert await service.get_user_state(app_name="b", user_id="u") == {}
    assert [s.id for s in (await service.list_sessions(app_name="b")).sessions] == [a.id]


async def test_recent_events_cost_the_same_at_100_and_30000_events(
    service: RunifoldSessionService, client: AsyncClient, app: str
) -> None:
    """get_session(num_recent_events=16) reads 16 entries, however long the session."""
    read: dict[int, list[int]] = {}
    for length in (100, 30_000):
        session = await service.create_session(app_name=app, user_id="u")
        cid = service._scope(app).conversation_id("u", session.id)
        version = 0
        for start in range(0, length, 256):  # the events, written in bulk
            batch = [
                Event(author="user", invocation_id=f"i{n}", timestamp=float(n))
                for n in range(start, min(start + 256, length))
            ]
            reply = await client.append(
                cid,
                [event_to_message(e) for e in batch],
                namespace=app,
                expected_version=version,
            )
            version = reply.version
        sequences: list[int] = []
        original = client.entries

        def counting(
            *args: Any, sink: list[int] = sequences, read: Any = original, **kwargs: Any
        ) -> Any:
            async def pages() -> Any:
                async for entry in read(*args, **kwargs):
                    sink.append(entry.sequence)
                    yield entry

            return pages()

        client.entries = counting  # type: ignore[method-assign]
        try:
            got = await service.get_session(
                app_name=app,
                user_id="u",
                session_id=session.id,
                config=GetSessionConfig(num_recent_events=16),
            )
        finally:
            client.entries = original  # type: ignore[method-assign]
        assert got is not None and [e.timestamp for e in got.events] == [
            float(n) for n in range(length - 16, length)
        ]
        read[length] = sequences
    assert len(read[100]) == len(read[30_000]) == 16


# -- memory ------------------------------------------------------------------------------


async def test_memory_add_search_delete_with_provenance(
    service: RunifoldSessionService, client: AsyncClient, app: str
) -> None:
    memory = RunifoldMemoryService(client=client, propose_sessions=False)
    session = await service.create_session(app_name=app, user_id="u1")
    said = types.Content(role="user", parts=[types.Part(text="My dog is called Biscuit.")])
    await service.append_event(session, Event(author="user", content=said))
    await memory.add_session_to_memory(session)  # propose_sessions=False: stores nothing
    assert (await memory.search_memory(app_name=app, user_id="u1", query="dog")).memories == []
    fact = MemoryEntry(content=types.Content(parts=[types.Part(text="The dog is Biscuit.")]))
    with pytest.raises(ValueError, match="session_id"):
        await memory.add_memory(app_name=app, user_id="u1", memories=[fact])
    await memory.add_memory(
        app_name=app, user_id="u1", memories=[fact], custom_metadata={"session_id": session.id}
    )
    found: list[MemoryEntry] = []

    async def indexed() -> bool:  # the vector index follows the record (its outbox)
        found[:] = (await memory.search_memory(app_name=app, user_id="u1", query="dog")).memories
        return bool(found)

    await wait_for(indexed, timeout=30)
    assert [m.content.parts[0].text for m in found] == ["The dog is Biscuit."]
    (provenance,) = found[0].custom_metadata["sources"]
    assert (provenance["from_sequence"], provenance["through_sequence"]) == (1, 1)
    other = await memory.search_memory(app_name=app, user_id="u2", query="dog")
    assert other.memories == []
    await memory.delete_memory(app_name=app, user_id="u1", memory_id=found[0].id)
    assert (await memory.search_memory(app_name=app, user_id="u1", query="dog")).memories == []


# -- ADK's Runner, end to end ------------------------------------------------------------


class ScriptedModel(BaseLlm):  # type: ignore[misc]  # google.adk is not type-checked here
    """An offline model: calls the `remember` tool once, then answers with a text that
    names what the request held."""

    model: str = "scripted"

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        contents = llm_request.contents or []
        answered = any(p.function_response for c in contents for p in c.parts or [])
        if not answered:
            call = types.FunctionCall(name="remember", args={"fact": "tea"})
            yield LlmResponse(
                content=types.Content(role="model", parts=[types.Part(function_call=call)])
            )
            return
        texts = [p.text for c in contents for p in c.parts or [] if p.text]
        yield LlmResponse(
            content=types.Content(role="model", parts=[types.Part(text=f"saw {len(texts)} texts")])
        )


def remember(fact: str, tool_context: ToolContext) -> dict[str, str]:
    """Remember a fact in every scope of state."""
    tool_context.state["app:drink"] = fact
    tool_context.state["user:drink"] = fact
    tool_context.state["last"] = fact
    tool_context.state["temp:scratch"] = fact
    return {"stored": fact}


async def test_runner_end_to_end(client: AsyncClient, app: str) -> None:
    """ADK's Runner with the Runifold services: a tool call that sets state of every
    prefix, the events stored in order, a second turn seeing the first, a stale writer
    refused."""
    sessions = RunifoldSessionService(client=client)
    agent = LlmAgent(name="helper", model=ScriptedModel(), tools=[remember])
    runner = Runner(
        agent=agent,
        app_name=app,
        session_service=sessions,
        memory_service=RunifoldMemoryService(client=client),
    )
    session = await sessions.create_session(app_name=app, user_id="ada")
    message = types.Content(role="user", parts=[types.Part(text="I like tea.")])
    events = [
        e async for e in runner.run_async(user_id="ada", session_id=session.id, new_message=message)
    ]
    assert events[-1].content is not None and events[-1].content.parts[0].text == "saw 1 texts"
    stored = await sessions.get_session(app_name=app, user_id="ada", session_id=session.id)
    assert stored is not None
    assert [e.author for e in stored.events] == ["user", "helper", "helper", "helper"]
    assert [e.id for e in stored.events][1:] == [e.id for e in events if not e.partial]
    assert stored.state == {"app:drink": "tea", "user:drink": "tea", "last": "tea"}
    assert await sessions.get_user_state(app_name=app, user_id="ada") == {"drink": "tea"}
    other = await sessions.create_session(app_name=app, user_id="bob")
    assert other.state == {"app:drink": "tea"}
    # A writer holding the session as it was before the run is stale now.
    with pytest.raises(StaleSessionError):
        await sessions.append_event(session, Event(author="user", invocation_id="late"))
    again = types.Content(role="user", parts=[types.Part(text="And coffee?")])
    second = [
        e async for e in runner.run_async(user_id="ada", session_id=session.id, new_message=again)
    ]
    assert second[-1].content is not None and second[-1].content.parts[0].text == "saw 3 texts"


async def test_add_session_to_memory_stores_what_is_proposed_with_its_source(
    service: RunifoldSessionService, client: AsyncClient, app: str
) -> None:
    """ProposeMemories (the offline proposer) over the session; each stored memory
    points at the entry it came from, is tagged with its user, and a second call
    stores nothing twice. Another user's session of the same app stays apart."""
    memory = RunifoldMemoryService(client=client)
    session = await service.create_session(app_name=app, user_id="u1")
    for text in ("Hello there.", "I live in Lisbon.", "What is the weather like?"):
        said = types.Content(role="user", parts=[types.Part(text=text)])
        await service.append_event(session, Event(author="user", content=said))
    await memory.add_session_to_memory(session)
    found: list[MemoryEntry] = []

    async def indexed() -> bool:
        found[:] = (
            await memory.search_memory(app_name=app, user_id="u1", query="where do I live")
        ).memories
        return bool(found)

    await wait_for(indexed, timeout=30)
    assert len(found) == 1 and "Lisbon" in found[0].content.parts[0].text
    (provenance,) = found[0].custom_metadata["sources"]
    assert (provenance["from_sequence"], provenance["through_sequence"]) == (2, 2)
    await memory.add_session_to_memory(session)  # the same session again: a duplicate
    again = await memory.search_memory(app_name=app, user_id="u1", query="where do I live")
    assert [m.id for m in again.memories] == [found[0].id]
    other = await memory.search_memory(app_name=app, user_id="u2", query="where do I live")
    assert other.memories == []


async def test_a_session_made_again_under_its_id_is_remembered_again(
    service: RunifoldSessionService, client: AsyncClient, app: str
) -> None:
    """ADK keeps session ids: a session deleted (erased, with its memories) and made again
    under the same id, saying the same, is remembered again. Its writes are not mistaken
    for retries of the erased session's (their request ids name the incarnation, which the
    proposal's sources carry to UpsertMemory)."""
    memory = RunifoldMemoryService(client=client)

    async def remembered() -> list[MemoryEntry]:
        await memory.add_session_to_memory(session)
        found: list[MemoryEntry] = []

        async def indexed() -> bool:
            found[:] = (
                await memory.search_memory(app_name=app, user_id="u1", query="where do I live")
            ).memories
            return bool(found)

        await wait_for(indexed, timeout=30)
        return found

    said = types.Content(role="user", parts=[types.Part(text="I live in Lisbon.")])
    session = await service.create_session(app_name=app, user_id="u1", session_id="fixed")
    await service.append_event(session, Event(author="user", content=said))
    (first,) = await remembered()
    await service.delete_session(app_name=app, user_id="u1", session_id="fixed")
    gone = await memory.search_memory(app_name=app, user_id="u1", query="where do I live")
    assert gone.memories == []
    session = await service.create_session(app_name=app, user_id="u1", session_id="fixed")
    await service.append_event(session, Event(author="user", content=said))
    (second,) = await remembered()
    assert second.id != first.id and "Lisbon" in second.content.parts[0].text
