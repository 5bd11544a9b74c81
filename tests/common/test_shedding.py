"""The load-shedding parts on their own: the slot queue in front of a slow resource,
per-namespace admission, the limits' settings, and the transport cap's arithmetic."""

from __future__ import annotations

import asyncio
import contextvars
import signal
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from prometheus_client import REGISTRY

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.common.v1 import common_pb2
from runifold.transcript.v1 import transcript_service_pb2 as transcript_pb
from services.agent.config import AgentConfig
from services.agent.turn import inputs
from services.common import admission, messages, validation
from services.common.admission import Admission
from services.common.errors import DomainError
from services.common.server import MIN_RECEIVE_MESSAGE_BYTES, receive_cap
from services.common.settings import AdmissionLimits, Settings, SettingsError, TransportLimits
from services.common.shedding import SlotQueue
from services.llm.model import ChatMessage, ChatRequest
from services.llm.openai import OpenAIChatModel
from services.memory.embeddings.local import LocalEmbedder, _Pending
from services.transcript.component import TranscriptComponent
from services.transcript.config import TranscriptLimits
from tests.support.fake_openai import fake_openai
from tests.support.waiting import wait_for

T = TypeVar("T")
SEARCH = "/runifold.memory.v1.MemoryService/SearchMemories"
TURN = "/runifold.agent.v1.AgentService/RunConversation"
STREAM = "/runifold.agent.v1.AgentService/StreamConversation"


def holds(predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return predicate()

    return check


def shed(resource: str, reason: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "runifold_requests_shed_total", {"resource": resource, "reason": reason}
        )
        or 0.0
    )


# -- the slot queue ---------------------------------------------------------------------


async def test_a_full_slot_queue_refuses_at_once_with_a_retry_delay() -> None:
    queue = SlotQueue("model", max_concurrent=1, max_queued=1)
    before = shed("model", "OVERLOADED")
    held, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with queue.slot(10):
            held.set()
            await release.wait()

    first = asyncio.ensure_future(hold())
    await held.wait()
    waiting = asyncio.ensure_future(hold())
    await wait_for(holds(lambda: queue.waiting == 1))
    with pytest.raises(DomainError) as refused:
        async with queue.slot(10):
            pass
    assert refused.value.code.value == "RESOURCE_EXHAUSTED"
    assert refused.value.reason == "OVERLOADED"
    assert refused.value.metadata == {"resource": "model"}
    assert refused.value.retry_after_s is not None and refused.value.retry_after_s > 0
    assert shed("model", "OVERLOADED") == before + 1
    release.set()
    await asyncio.gather(first, waiting)  # the one that waited was served
    assert queue.held == 0 and queue.waiting == 0


async def test_a_wait_ends_at_the_deadline_and_a_cancelled_waiter_gives_up_its_place() -> None:
    queue = SlotQueue("model", max_concurrent=1, max_queued=2)
    release = asyncio.Event()
    held = asyncio.Event()

    async def hold() -> None:
        async with queue.slot():
            held.set()
            await release.wait()

    holder = asyncio.ensure_future(hold())
    await held.wait()
    with pytest.raises(DomainError) as late:
        async with queue.slot(0.05):
            pass
    assert late.value.reason == "DEADLINE_EXCEEDED"
    assert queue.waiting == 0, "a waiter past its deadline leaves the queue"

    async def enter() -> str:
        async with queue.slot(10):
            return "served"

    cancelled = asyncio.ensure_future(enter())
    served = asyncio.ensure_future(enter())
    await wait_for(holds(lambda: queue.waiting == 2))
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert queue.waiting == 1
    release.set()
    await holder
    assert await served == "served"
    assert queue.held == 0


async def test_the_slot_queue_serves_namespaces_in_turns_not_first_come() -> None:
    queue = SlotQueue("model", max_concurrent=1, max_queued=16)
    release = asyncio.Event()
    served: list[str] = []

    async def call(lane: str) -> None:
        async with queue.slot(10, lane):
            served.append(lane)
            await release.wait()

    holder = asyncio.ensure_future(call("busy"))
    await wait_for(holds(lambda: queue.held == 1))
    flood = [asyncio.ensure_future(call("busy")) for _ in range(6)]
    await wait_for(holds(lambda: queue.waiting == 6))
    quiet = asyncio.ensure_future(call("quiet"))  # one call, after a burst of another
    await wait_for(holds(lambda: queue.waiting == 7))
    release.set()
    await asyncio.gather(holder, *flood, quiet)
    # The quiet namespace waited for the call that held the slot, not for the burst.
    assert served[:2] == ["busy", "quiet"]
    assert queue.held == queue.waiting == 0


# -- admission -------------------------------------------------------------------------


class _Request:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace


@pytest.fixture(autouse=True)
def own_context() -> Iterator[None]:
    """Admission keeps each call's slot in a context variable: leave none behind."""
    slot, namespace = admission._slot_var.set(None), admission.namespace_var.set(None)
    yield
    admission._slot_var.reset(slot)
    admission.namespace_var.reset(namespace)


def test_a_namespace_at_its_limit_is_refused_and_another_is_not() -> None:
    admissions = Admission(AdmissionLimits(turns=2, retry_after_s=3.0))
    before = shed("turn", "NAMESPACE_CONCURRENCY_LIMIT")
    slots = []
    for method in (TURN, STREAM):  # one kind: a namespace's turns, however asked for
        admissions.enter(method, _Request("tenant-a"))
        slots.append(admission._slot_var.get())
    with pytest.raises(DomainError) as refused:
        admissions.enter(TURN, _Request("tenant-a"))
    assert refused.value.code.value == "RESOURCE_EXHAUSTED"
    assert refused.value.reason == "NAMESPACE_CONCURRENCY_LIMIT"
    assert refused.value.metadata == {"kind": "turn", "limit": "2"}
    assert refused.value.retry_after_s == 3.0  # nothing finished yet: the configured hint
    assert shed("turn", "NAMESPACE_CONCURRENCY_LIMIT") == before + 1
    admissions.enter(TURN, _Request("tenant-b"))  # another namespace is admitted
    admissions.enter(SEARCH, _Request("tenant-a"))  # another kind too
    for slot in slots:
        assert slot is not None
        slot.release()
        slot.release()  # idempotent
    assert admissions.in_flight("turn", "tenant-a") == 0
    admissions.enter(TURN, _Request("tenant-a"))


def test_methods_without_a_kind_and_kinds_without_a_limit_pass() -> None:
    admissions = Admission(AdmissionLimits(searches=0, turns=1))
    for _ in range(5):
        admissions.enter("/runifold.transcript.v1.TranscriptService/AppendEntries", _Request("a"))
        admissions.enter(SEARCH, _Request("a"))
    assert admissions.in_flight("search", "a") == 0


def _slot(context: contextvars.Context) -> admission.Slot:
    """The admission a call running in `context` holds."""
    slot = context.run(admission.current)
    assert slot is not None
    return slot


async def test_a_parked_call_gives_its_slot_up_and_resumes_within_the_limit() -> None:
    admissions = Admission(AdmissionLimits(turns=1))
    # Calls, each in its own context as the guard serves them.
    waiting, other, late = (contextvars.copy_context() for _ in range(3))
    waiting.run(admissions.enter, TURN, _Request("a"))
    slot = _slot(waiting)
    slot.park()
    assert (admissions.in_flight("turn", "a"), admissions.in_flight("turn_wait", "a")) == (0, 1)
    other.run(admissions.enter, TURN, _Request("a"))  # admitted while the first one waits
    # The wait is over: the parked call waits for the slot; the namespace's limit holds.
    resuming = asyncio.ensure_future(slot.resume(10))
    await wait_for(holds(lambda: admissions.resuming("turn", "a") == 1))
    assert admissions.in_flight("turn", "a") == 1
    # A slot freed goes to the resuming call, before any new call of the namespace.
    other.run(admission.leave)
    with pytest.raises(DomainError) as refused:
        late.run(admissions.enter, TURN, _Request("a"))
    assert refused.value.reason == "NAMESPACE_CONCURRENCY_LIMIT"
    await resuming
    assert slot.held and not slot.parked
    assert (admissions.in_flight("turn", "a"), admissions.in_flight("turn_wait", "a")) == (1, 0)
    waiting.run(admission.leave)
    assert (admissions.in_flight("turn", "a"), admissions.resuming("turn", "a")) == (0, 0)


async def test_waiting_places_are_bounded_and_a_refused_call_keeps_its_slot() -> None:
    admissions = Admission(AdmissionLimits(turns=4, waiting_turns=1))
    first, second = contextvars.copy_context(), contextvars.copy_context()
    first.run(admissions.enter, TURN, _Request("a"))
    second.run(admissions.enter, TURN, _Request("a"))
    _slot(first).park()
    before = shed("turn_wait", "NAMESPACE_CONCURRENCY_LIMIT")
    with pytest.raises(DomainError) as refused:
        _slot(second).park()
    assert refused.value.code.value == "RESOURCE_EXHAUSTED"
    assert refused.value.metadata == {"kind": "turn_wait", "limit": "1"}
    assert refused.value.retry_after_s is not None
    assert shed("turn_wait", "NAMESPACE_CONCURRENCY_LIMIT") == before + 1
    assert _slot(second).held  # refused: it still holds its slot
    # Another namespace has waiting places of its own.
    third = contextvars.copy_context()
    third.run(admissions.enter, TURN, _Request("b"))
    _slot(third).park()
    for context in (first, second, third):
        context.run(admission.leave)  # a parked call's place goes when it ends
    assert admissions.in_flight("turn_wait", "a") == admissions.in_flight("turn", "a") == 0
    assert admissions.in_flight("turn_wait", "b") == 0


async def test_a_resume_past_its_deadline_or_cancelled_leaves_no_trace() -> None:
    admissions = Admission(AdmissionLimits(turns=1))
    parked, holder = contextvars.copy_context(), contextvars.copy_context()
    parked.run(admissions.enter, TURN, _Request("a"))
    slot = _slot(parked)
    slot.park()
    holder.run(admissions.enter, TURN, _Request("a"))
    with pytest.raises(DomainError) as late:
        await slot.resume(0.05)
    assert late.value.reason == "DEADLINE_EXCEEDED"
    cancelled = asyncio.ensure_future(slot.resume(10))
    await wait_for(holds(lambda: admissions.resuming("turn", "a") == 1))
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert admissions.resuming("turn", "a") == 0
    holder.run(admission.leave)
    assert admissions.in_flight("turn", "a") == 0  # nobody took the freed slot
    parked.run(admission.leave)
    assert admissions.in_flight("turn_wait", "a") == 0


async def test_many_waits_ending_together_never_exceed_the_limit() -> None:
    limit = 3
    admissions = Admission(AdmissionLimits(turns=limit, waiting_turns=20))
    slots = []
    for _ in range(12):  # each admitted while the ones before it wait
        context = contextvars.copy_context()
        context.run(admissions.enter, TURN, _Request("a"))
        slot = _slot(context)
        slot.park()
        slots.append(slot)
    peak = 0

    async def run(slot: admission.Slot) -> None:
        nonlocal peak
        await slot.resume(10)
        peak = max(peak, admissions.in_flight("turn", "a"))
        await asyncio.sleep(0)  # a turn's work, interleaved with the others'
        slot.release()

    await asyncio.gather(*(run(slot) for slot in slots))
    assert peak == limit
    assert admissions.in_flight("turn", "a") == admissions.in_flight("turn_wait", "a") == 0


def test_every_admitted_method_exists() -> None:
    from runifold.memory.v1 import memory_service_pb2
    from runifold.summary.v1 import summary_service_pb2

    methods = {
        f"/{service.full_name}/{method.name}"
        for module in (agent_pb, memory_service_pb2, summary_service_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert set(admission.KINDS) <= methods


# -- settings --------------------------------------------------------------------------


def test_limits_read_from_the_environment_and_bad_values_name_the_variable() -> None:
    limits = AdmissionLimits.from_env({"RUNIFOLD_NAMESPACE_MAX_SEARCHES": "3"})
    assert (limits.searches, limits.turns, limits.limit("propose")) == (3, 8, 4)
    assert AdmissionLimits.from_env({"RUNIFOLD_NAMESPACE_MAX_PROPOSALS": "1"}).limit("propose") == 1
    transport = TransportLimits.from_env({"RUNIFOLD_MAX_CONNECTION_IDLE_S": "0"})
    assert transport.max_receive_message_bytes is None and transport.max_connection_idle_s == 0
    for name, value in (
        ("RUNIFOLD_NAMESPACE_MAX_TURNS", "-1"),
        ("RUNIFOLD_MAX_CONNECTIONS", "many"),
        ("RUNIFOLD_HANDSHAKE_TIMEOUT_S", "0"),
        ("RUNIFOLD_MAX_RECEIVE_MESSAGE_BYTES", "1000"),
    ):
        with pytest.raises(SettingsError, match=name):
            Settings.from_env({name: value})


# -- the transport cap -------------------------------------------------------------------


def _largest_append(limits: messages.MessageLimits) -> transcript_pb.AppendEntriesRequest:
    """An AppendEntries as large on the wire as the limits allow: every message with
    the most metadata entries and tool calls, their bytes adding up to the limit."""
    count, calls = limits.max_messages_per_append, limits.max_tool_calls_per_message
    metadata = {
        f"k{i:0{validation.MAX_METADATA_KEY_CHARS - 1}d}": "v" * 200
        for i in range(validation.MAX_METADATA_ENTRIES)
    }
    tool_calls = [
        common_pb2.ToolCall(id=f"call-{i}", name="lookup", arguments_json="{}")
        for i in range(calls)
    ]
    framing_free = sum(len(k) + len(v) for k, v in metadata.items()) + sum(
        len(c.id) + len(c.name) + len(c.arguments_json) for c in tool_calls
    )
    text = "x" * (limits.max_append_bytes // count - framing_free)
    return transcript_pb.AppendEntriesRequest(
        conversation_id=str(uuid.uuid4()),
        namespace="n" * 128,
        request_id="r" * 128,
        expected_version=2**62,
        fencing_token=2**62,
        messages=[
            common_pb2.Message(
                role=common_pb2.ROLE_ASSISTANT, text=text, tool_calls=tool_calls, metadata=metadata
            )
            for _ in range(count)
        ],
    )


def test_the_largest_append_fits_the_transport_cap_and_little_more_does() -> None:
    limits = TranscriptLimits().messages
    largest = _largest_append(limits).ByteSize()
    bound = messages.append_request_bytes(limits)
    cap = receive_cap([TranscriptComponent(TranscriptLimits())], TransportLimits())
    assert largest <= bound <= cap
    # "Just above": the cap leaves less than a tenth of the append limit on top.
    assert cap < largest + limits.max_append_bytes // 10
    assert cap < 16 * 1024 * 1024 // 3  # the old cap was 16 MiB


def test_the_largest_turn_fits_the_agents_bound() -> None:
    config = AgentConfig()
    tools = [
        common_pb2.ToolDefinition(
            name=f"{i:064d}",
            description="d" * 16 * 1024,
            parameters_json_schema="{" + " " * (config.max_tool_schema_bytes - 2) + "}",
        )
        for i in range(config.max_tools)
    ]
    per_message = config.max_input_bytes // config.max_input_messages
    request = agent_pb.RunConversationRequest(
        conversation_id=str(uuid.uuid4()),
        namespace="n" * 128,
        turn_id="t" * 128,
        input=[
            common_pb2.Message(role=common_pb2.ROLE_USER, text="u" * per_message)
            for _ in range(config.max_input_messages)
        ],
        tools=tools,
        system_instructions="s" * config.max_system_instructions_bytes,
    )
    assert request.ByteSize() <= inputs.request_bytes(config)


def test_an_explicit_cap_wins_and_small_services_get_the_floor() -> None:
    assert receive_cap([], TransportLimits(max_receive_message_bytes=16 << 20)) == 16 << 20
    assert receive_cap([], TransportLimits()) == MIN_RECEIVE_MESSAGE_BYTES


# -- the embedding queue's passes ---------------------------------------------------------


def _within(seconds: float, run: Callable[[], T]) -> T:
    """`run()` on this thread, interrupted with TimeoutError after `seconds` (a spin
    would hang the suite otherwise)."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError("the call did not return")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return run()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


async def test_a_pass_drops_callers_cancelled_since_the_last_one() -> None:
    embedder = LocalEmbedder()
    # No worker: the test builds the pass itself (no model is loaded).
    idle = asyncio.Event()

    async def no_worker() -> None:
        await idle.wait()

    embedder._worker = asyncio.ensure_future(no_worker())
    embedder._wakeup = asyncio.Event()
    before = sample_abandoned("cancelled")
    callers = [asyncio.ensure_future(embedder.embed([f"text {i}"])) for i in range(3)]
    await wait_for(holds(lambda: embedder.queued == 3))
    # Cancelled just now: their futures are done, their callbacks not yet run (they
    # run on the loop's next turn, after the pass is built).
    callers[0].cancel()
    callers[2].cancel()
    taken = _within(5, embedder._next_pass)
    assert [(item.texts, start, end) for item, start, end in taken] == [(["text 1"], 0, 1)]
    assert embedder.queued == 0
    assert sample_abandoned("cancelled") == before + 2
    embedder._worker.cancel()
    callers[1].cancel()
    await asyncio.gather(*callers, embedder._worker, return_exceptions=True)
    assert sample_abandoned("cancelled") == before + 2, "counted once"


def sample_abandoned(cause: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "runifold_work_abandoned_total", {"resource": "embeddings", "cause": cause}
        )
        or 0.0
    )


async def test_a_namespace_over_its_share_of_the_model_is_refused_only_while_others_use_it() -> (
    None
):
    embedder = LocalEmbedder(namespace_share=0.25)
    idle = asyncio.Event()

    async def no_worker() -> None:
        await idle.wait()

    embedder._worker = asyncio.ensure_future(no_worker())
    embedder._wakeup = asyncio.Event()

    def busy(namespace: str, seconds: float) -> None:
        # A pass that kept the model busy `seconds`, all of it for `namespace`.
        item = pending(namespace)
        embedder._charge([(item, 0, 1)], seconds)

    def embed_as(namespace: str) -> asyncio.Future[list[list[float]]]:
        context = contextvars.copy_context()
        context.run(admission.namespace_var.set, namespace)
        return context.run(asyncio.ensure_future, embedder.embed(["a query"]))

    busy("flood", 5.0)  # half of the 10 s window: over a quarter
    alone = embed_as("flood")  # alone, a namespace may use all of the model
    await wait_for(holds(lambda: embedder.queued == 1))
    busy("quiet", 0.2)
    alone_again = embed_as("flood")  # the other used it lately, but waits for nothing
    await wait_for(holds(lambda: embedder.queued == 2))
    served = embed_as("quiet")  # the other namespace waits now: it is not refused
    await wait_for(holds(lambda: embedder.queued == 3))
    before = shed("embeddings", "NAMESPACE_SHARE_EXCEEDED")
    with pytest.raises(DomainError) as refused:
        await asyncio.wait_for(embed_as("flood"), 5)  # refused at once, not queued
    assert refused.value.reason == "NAMESPACE_SHARE_EXCEEDED"
    assert refused.value.code.value == "RESOURCE_EXHAUSTED"
    assert refused.value.metadata == {"resource": "embeddings", "share": "0.25"}
    assert refused.value.retry_after_s is not None and refused.value.retry_after_s > 0
    assert shed("embeddings", "NAMESPACE_SHARE_EXCEEDED") == before + 1
    # Over its share too (one call at a time keeps the model busy a good part of the
    # time), but less than the flood: the lighter namespace is never the one refused.
    busy("quiet", 3.0)
    also = embed_as("quiet")
    await wait_for(holds(lambda: embedder.queued == 4))
    with pytest.raises(DomainError):
        await asyncio.wait_for(embed_as("flood"), 5)
    pending_calls = (alone, alone_again, served, also, embedder._worker)
    for task in pending_calls:
        task.cancel()
    await asyncio.gather(*pending_calls, return_exceptions=True)


def pending(namespace: str) -> _Pending:
    future: asyncio.Future[list[list[float]]] = asyncio.get_running_loop().create_future()
    return _Pending(["x" * 1000], future, None, namespace)


async def test_a_long_text_that_does_not_fit_a_pass_lets_shorter_ones_through() -> None:
    embedder = LocalEmbedder(batch_tokens=256)
    idle = asyncio.Event()

    async def no_worker() -> None:
        await idle.wait()

    embedder._worker = asyncio.ensure_future(no_worker())
    embedder._wakeup = asyncio.Event()

    def embed_as(namespace: str, text: str) -> asyncio.Future[list[list[float]]]:
        context = contextvars.copy_context()
        context.run(admission.namespace_var.set, namespace)
        return context.run(asyncio.ensure_future, embedder.embed([text]))

    long, short = "x" * 4000, "where do we deploy?"
    callers: list[asyncio.Future[list[list[float]]]] = []

    def all_queued() -> bool:
        return embedder.queued == len(callers)

    # A namespace with nothing queued goes to the front: the line is q1, flood, q2.
    for namespace, text in (("q2", short), ("flood", long), ("q1", short)):
        callers.append(embed_as(namespace, text))
        await wait_for(holds(all_queued))
    first = [(item.namespace, item.texts[0]) for item, _, _ in embedder._next_pass()]
    second = [(item.namespace, item.texts[0]) for item, _, _ in embedder._next_pass()]
    # The long text waits one pass, at the front; the short ones behind it do not.
    assert first == [("q1", short), ("q2", short)]
    assert second == [("flood", long)]
    for caller in callers:
        caller.cancel()
    embedder._worker.cancel()
    await asyncio.gather(*callers, embedder._worker, return_exceptions=True)


async def test_chat_model_calls_beyond_the_queue_are_overloaded_and_waits_end_at_the_deadline() -> (
    None
):
    release = asyncio.Event()

    async def held(body: Any) -> str:
        await release.wait()
        return "done"

    async with fake_openai() as server:
        server.respond_with(held)
        model = OpenAIChatModel(
            server.base_url, "fake", max_retries=0, max_concurrent=1, max_queued=1
        )
        request = ChatRequest([ChatMessage("user", "hello")])
        try:
            running = asyncio.ensure_future(model.complete(request, timeout=30))
            await wait_for(holds(lambda: len(server.chat_requests) == 1))
            # One waits behind it; the wait ends at its deadline, its place given up.
            with pytest.raises(DomainError) as late:
                await model.complete(request, timeout=0.2)
            assert late.value.reason == "DEADLINE_EXCEEDED"
            waiting = asyncio.ensure_future(model.complete(request, timeout=30))
            await wait_for(holds(lambda: model._slots.waiting == 1))
            with pytest.raises(DomainError) as refused:
                await model.complete(request, timeout=30)
            assert refused.value.reason == "OVERLOADED"
            assert refused.value.metadata == {"resource": "model"}
            assert refused.value.retry_after_s is not None and refused.value.retry_after_s > 0
            assert len(server.chat_requests) == 1, "neither reached the model"
            release.set()
            assert [r.text for r in await asyncio.gather(running, waiting)] == ["done", "done"]
        finally:
            await model.aclose()
