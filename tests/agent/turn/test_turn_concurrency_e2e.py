"""Turn concurrency end to end: RACE, REJECT and ENQUEUE with a model call held open,
one model call per turn_id, and a model reply that breaks the transcript's limits.

Every service runs for real in one server; the model is the fake OpenAI server, whose
answers are held until the test releases them, so the turns really overlap.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import psycopg
import pytest

from runifold.agent.v1 import agent_service_pb2 as pb
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.transcript.config import TranscriptLimits
from tests.support.fake_openai import FakeOpenAI, FakeReply, FakeToolCall
from tests.support.grpc_calls import reason, status_detail, user
from tests.support.stack import Stack, full_stack
from tests.support.waiting import wait_for

RACE = pb.CONCURRENCY_MODE_RACE
REJECT = pb.CONCURRENCY_MODE_REJECT
ENQUEUE = pb.CONCURRENCY_MODE_ENQUEUE
QUEUE_DEPTH = 2


def holds(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """A plain predicate for tests.support.waiting.wait_for."""

    async def check() -> bool:
        return predicate()

    return check


class HeldModel:
    """Answers each chat request only once the test releases its last user text."""

    def __init__(self, model: FakeOpenAI) -> None:
        self.model = model
        self.releases: dict[str, asyncio.Event] = {}
        self.reply: dict[str, FakeReply] = {}
        model.respond_with(self._respond)

    def release(self, text: str) -> asyncio.Event:
        return self.releases.setdefault(text, asyncio.Event())

    async def _respond(self, body: Any) -> FakeReply:
        text = body["messages"][-1]["content"]
        await asyncio.wait_for(self.release(text).wait(), 30)  # bounded: a stuck test fails
        return self.reply.get(text, FakeReply(text=f"answer to {text}", usage=(10, 3)))

    def asked(self, text: str) -> int:
        """How many chat requests ended with this user text."""
        return sum(1 for r in self.model.chat_requests if r.messages[-1]["content"] == text)


@pytest.fixture(scope="module")
async def stack(
    shared_database_url: str, model: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    async with full_stack(
        shared_database_url,
        tmp_path_factory.mktemp("turns"),
        model,
        transcript_limits=TranscriptLimits(turn_queue_depth=QUEUE_DEPTH),
    ) as running:
        yield running


@pytest.fixture
def held(model: FakeOpenAI) -> HeldModel:
    model.recover()
    model.delay = 0
    model.requests.clear()
    return HeldModel(model)


async def conversation(stack: Stack, namespace: str) -> str:
    created = await stack.transcript.CreateConversation(
        transcript_pb.CreateConversationRequest(namespace=namespace)
    )
    return created.conversation.conversation_id


def turn(
    namespace: str, cid: str, text: str, mode: int = RACE, turn_id: str = ""
) -> pb.RunConversationRequest:
    return pb.RunConversationRequest(
        namespace=namespace,
        conversation_id=cid,
        input=[user(text)],
        turn_id=turn_id or f"turn-{uuid.uuid4().hex}",
        concurrency=mode,  # type: ignore[arg-type]
    )


async def texts(stack: Stack, namespace: str, cid: str) -> list[str]:
    page = await stack.transcript.ListEntries(
        transcript_pb.ListEntriesRequest(namespace=namespace, conversation_id=cid)
    )
    return [e.message.text for e in page.entries]


async def turn_state(database_url: str, turn_id: str) -> str | None:
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cursor = await conn.execute(
            "SELECT state FROM transcript.turns WHERE turn_id = %s", (turn_id,)
        )
        row = await cursor.fetchone()
    return row[0] if row else None


@pytest.mark.parametrize("mode", [RACE, REJECT, ENQUEUE], ids=["race", "reject", "enqueue"])
async def test_one_turn_id_sent_twice_at_once_calls_the_model_once(
    stack: Stack, held: HeldModel, namespace: str, mode: int
) -> None:
    cid = await conversation(stack, namespace)
    request = turn(namespace, cid, "only once", mode)
    first = asyncio.ensure_future(stack.agent.RunConversation(request))
    await wait_for(holds(lambda: held.asked("only once") == 1))
    second = asyncio.ensure_future(stack.agent.RunConversation(request))
    await wait_for(holds(_waiting_for_same_turn))
    held.release("only once").set()
    results = await asyncio.gather(first, second)
    assert held.asked("only once") == 1, "the model ran once for one turn_id"
    assert sorted(r.replayed for r in results) == [False, True]
    assert {r.outcome.output[0].text for r in results} == {"answer to only once"}
    assert results[0].conversation_version == results[1].conversation_version == 1
    # The replay reports the usage the turn recorded (not zero, not twice).
    assert all(r.outcome.usage.output_tokens == 3 for r in results)
    assert await texts(stack, namespace, cid) == ["only once", "answer to only once"]


def _counter(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


def _waiting_for_same_turn() -> bool:
    from prometheus_client import REGISTRY

    value = REGISTRY.get_sample_value("runifold_turns_waiting", {"why": "same_turn"})
    return bool(value and value >= 1)


async def test_reject_refuses_a_second_turn_before_any_model_call(
    stack: Stack, held: HeldModel, namespace: str
) -> None:
    cid = await conversation(stack, namespace)
    refused = {
        where: _counter("runifold_turn_busy_refusals_total", where=where)
        for where in ("lease", "append")
    }
    running = turn(namespace, cid, "first", REJECT)
    first = asyncio.ensure_future(stack.agent.RunConversation(running))
    await wait_for(holds(lambda: held.asked("first") == 1))
    with pytest.raises(grpc.aio.AioRpcError) as busy:
        await stack.agent.RunConversation(turn(namespace, cid, "second", REJECT))
    assert busy.value.code() == grpc.StatusCode.ABORTED
    assert reason(busy.value) == "CONVERSATION_BUSY"
    assert held.asked("second") == 0, "refused before the model"
    from services.common.status import error_info

    info = error_info(busy.value)
    assert info is not None and info.metadata["running_turn_id"] == running.turn_id
    # A plain append is fenced out too while the turn holds the conversation.
    with pytest.raises(grpc.aio.AioRpcError) as fenced:
        await stack.transcript.AppendEntries(
            transcript_pb.AppendEntriesRequest(
                namespace=namespace, conversation_id=cid, messages=[user("sneaking in")]
            )
        )
    assert reason(fenced.value) == "CONVERSATION_BUSY"
    assert _counter("runifold_turn_busy_refusals_total", where="lease") == refused["lease"] + 1
    assert _counter("runifold_turn_busy_refusals_total", where="append") == refused["append"] + 1
    held.release("first").set()
    assert (await first).conversation_version == 1
    # Done: the next REJECT turn runs.
    held.release("third").set()
    assert (
        await stack.agent.RunConversation(turn(namespace, cid, "third", REJECT))
    ).conversation_version == 2


async def test_enqueue_runs_turns_in_arrival_order_each_on_the_last_ones_version(
    stack: Stack, held: HeldModel, namespace: str, shared_database_url: str
) -> None:
    cid = await conversation(stack, namespace)
    first = asyncio.ensure_future(stack.agent.RunConversation(turn(namespace, cid, "one", ENQUEUE)))
    await wait_for(holds(lambda: held.asked("one") == 1))
    queued = []
    for text in ("two", "three"):
        request = turn(namespace, cid, text, ENQUEUE)
        queued.append(asyncio.ensure_future(stack.agent.RunConversation(request)))

        async def waiting(turn_id: str = request.turn_id) -> bool:
            return await turn_state(shared_database_url, turn_id) == "waiting"

        await wait_for(waiting)
    # The queue is full (depth 2): a third waiting turn is refused with a retry delay.
    full_before = _counter("runifold_turn_queue_full_total")
    with pytest.raises(grpc.aio.AioRpcError) as full:
        await stack.agent.RunConversation(turn(namespace, cid, "four", ENQUEUE))
    assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert reason(full.value) == "TURN_QUEUE_FULL"
    from google.rpc import error_details_pb2

    assert status_detail(full.value, error_details_pb2.RetryInfo).retry_delay.seconds >= 1
    assert _counter("runifold_turn_queue_full_total") == full_before + 1
    assert held.asked("two") == held.asked("three") == 0, "queued turns call no model yet"

    for text in ("one", "two", "three"):
        held.release(text).set()
    results = [await first, *[await task for task in queued]]
    assert [r.conversation_version for r in results] == [1, 2, 3]
    # Each queued turn saw the turn before it: its prompt held that turn's answer.
    prompt_of_three = next(
        r.messages for r in held.model.chat_requests if r.messages[-1]["content"] == "three"
    )
    assert any(m.get("content") == "answer to two" for m in prompt_of_three)
    assert await texts(stack, namespace, cid) == [
        "one",
        "answer to one",
        "two",
        "answer to two",
        "three",
        "answer to three",
    ]


async def test_a_queued_turn_streams_that_it_waits(
    stack: Stack, held: HeldModel, namespace: str
) -> None:
    cid = await conversation(stack, namespace)
    first = asyncio.ensure_future(
        stack.agent.RunConversation(turn(namespace, cid, "ahead", ENQUEUE))
    )
    await wait_for(holds(lambda: held.asked("ahead") == 1))
    request = turn(namespace, cid, "behind", ENQUEUE)
    stream = stack.agent.StreamConversation(
        pb.StreamConversationRequest(
            namespace=namespace,
            conversation_id=cid,
            input=request.input,
            turn_id=request.turn_id,
            concurrency=ENQUEUE,
        )
    )
    stages = []
    async for event in stream:
        if event.HasField("progress"):
            stages.append(event.progress.stage)
            if event.progress.stage == pb.TURN_STAGE_WAITING:
                held.release("ahead").set()
                held.release("behind").set()
        if event.HasField("result"):
            assert event.result.conversation_version == 2
    assert stages[:2] == [pb.TURN_STAGE_LOADING_CONTEXT, pb.TURN_STAGE_WAITING]
    assert pb.TURN_STAGE_CALLING_MODEL in stages
    await first


async def test_race_lets_both_run_and_the_loser_keeps_its_outcome_for_its_turn_id(
    stack: Stack, held: HeldModel, namespace: str
) -> None:
    cid = await conversation(stack, namespace)
    a, b = turn(namespace, cid, "alpha"), turn(namespace, cid, "beta")
    tasks = [asyncio.ensure_future(stack.agent.RunConversation(r)) for r in (a, b)]
    await wait_for(holds(lambda: held.asked("alpha") == held.asked("beta") == 1))
    held.release("alpha").set()
    await tasks[0]
    held.release("beta").set()
    with pytest.raises(grpc.aio.AioRpcError) as lost:
        await tasks[1]
    assert reason(lost.value) == "TURN_CONFLICT"
    detail = status_detail(lost.value, pb.TurnConflict)
    assert detail.outcome.output[0].text == "answer to beta"
    # Retrying the loser's turn_id returns the same conflict: its model never runs again.
    with pytest.raises(grpc.aio.AioRpcError) as again:
        await stack.agent.RunConversation(b)
    assert reason(again.value) == "TURN_CONFLICT"
    assert status_detail(again.value, pb.TurnConflict).outcome.output[0].text == "answer to beta"
    assert held.asked("beta") == 1


@pytest.mark.parametrize(
    "reply",
    [
        FakeReply(tool_calls=[FakeToolCall("lookup", "{}", f"c{i}") for i in range(65)]),
        FakeReply(tool_calls=[FakeToolCall("lookup", "{}", "x" * 200)]),
    ],
    ids=["65-tool-calls", "200-character-call-id"],
)
async def test_a_reply_over_the_transcripts_limits_keeps_its_outcome_and_appends_nothing(
    stack: Stack, held: HeldModel, namespace: str, reply: FakeReply
) -> None:
    cid = await conversation(stack, namespace)
    request = turn(namespace, cid, "use the tools")
    request.tools.add(name="lookup", parameters_json_schema='{"type": "object"}')
    held.reply["use the tools"] = reply
    held.release("use the tools").set()
    with pytest.raises(grpc.aio.AioRpcError) as invalid:
        await stack.agent.RunConversation(request)
    assert invalid.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason(invalid.value) == "MODEL_OUTPUT_INVALID"
    detail = status_detail(invalid.value, pb.ModelOutputInvalid)
    assert len(detail.outcome.output[0].tool_calls) == len(reply.tool_calls)
    assert detail.outcome.usage.model_calls == 1
    assert detail.violations and detail.violations[0].startswith("output[0].tool_calls")
    assert await texts(stack, namespace, cid) == [], "nothing appended"
    with pytest.raises(grpc.aio.AioRpcError) as again:
        await stack.agent.RunConversation(request)
    assert reason(again.value) == "MODEL_OUTPUT_INVALID"
    assert held.asked("use the tools") == 1, "the model is not run again for the turn_id"
