"""Per-namespace admission (services/common/admission.py): limits by kind, parked calls
and their waiting places."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from services.common import admission
from services.common.admission import Admission
from services.common.errors import DomainError
from services.common.settings import AdmissionLimits
from tests.support.metrics import shed
from tests.support.waiting import holds, wait_for

SEARCH = "/runifold.memory.v1.MemoryService/SearchMemories"


TURN = "/runifold.agent.v1.AgentService/RunConversation"


STREAM = "/runifold.agent.v1.AgentService/StreamConversation"


# Admission keeps each call's slot in a context variable: none left behind (conftest.py).
pytestmark = pytest.mark.usefixtures("own_context")


class _Request:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace


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
