"""Turn leases, run against every TranscriptStore (test_leases_domain.py on the in-memory
store, test_leases_store.py on PostgreSQL): one model call per turn id, exclusive and
queued turns, the fencing token.

These drive TranscriptService directly. The guarantees across processes (an agent
killed or paused mid-turn, two agent replicas) are proven in tests/system/faults and
tests/agent.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from services.common.domain import Usage
from services.common.errors import DomainError
from services.transcript import metrics
from services.transcript.conversations.model import AppendRecord
from services.transcript.leases.model import EndedTurn, LeaseMode, TurnLease
from services.transcript.service import TranscriptService
from services.transcript.store import TranscriptStore
from tests.support.waiting import wait_for
from tests.transcript.support import assistant, make_service, new_conversation, user

HASH = b"input-digest"


async def acquire(
    service: TranscriptService,
    namespace: str,
    cid: str,
    turn_id: str,
    mode: LeaseMode = LeaseMode.SHARED,
    *,
    ttl_s: float = 30.0,
    payload_hash: bytes = HASH,
    create: bool = False,
) -> TurnLease | AppendRecord | EndedTurn:
    return await service.leases.acquire_turn_lease(
        namespace, cid, turn_id, int(mode), ttl_s, payload_hash, create
    )


async def lease(
    service: TranscriptService, namespace: str, cid: str, turn_id: str, **kw: object
) -> TurnLease:
    got = await acquire(service, namespace, cid, turn_id, **kw)  # type: ignore[arg-type]
    assert isinstance(got, TurnLease), got
    return got


async def commit(
    service: TranscriptService, namespace: str, cid: str, turn_id: str, token: int, text: str = "q"
) -> int:
    result = await service.append(
        namespace, cid, None, [user(text), assistant("a")], turn_id, Usage(1, 1, 1), token
    )
    return result.record.version


def in_line(gauge: Any, count: float) -> Callable[[], Awaitable[bool]]:
    """A predicate: at least `count` turns wait in a queue in this process."""

    async def check() -> bool:
        return bool(gauge._value.get() >= count)

    return check


async def pending(task: asyncio.Task[object]) -> bool:
    """True while `task` is still waiting (it got the chance to run first)."""
    for _ in range(5):
        await asyncio.sleep(0)
    return not task.done()


class TurnLeaseCases:
    """Subclasses provide a `store` fixture."""

    @pytest.fixture
    def service(self, store: TranscriptStore) -> TranscriptService:
        return make_service(store, turn_queue_depth=2)

    async def test_a_committed_turn_id_returns_its_append_not_a_lease(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        granted = await lease(service, namespace, cid, "t-1")
        assert await commit(service, namespace, cid, "t-1", granted.fencing_token) == 1
        again = await acquire(service, namespace, cid, "t-1")
        assert isinstance(again, AppendRecord) and again.version == 1 and again.last_sequence == 2

    async def test_a_running_turn_id_is_waited_for_then_replayed(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        first = await lease(service, namespace, cid, "t-1")
        duplicate = asyncio.create_task(acquire(service, namespace, cid, "t-1"))
        assert await pending(duplicate), "a second lease for one running turn id"
        await commit(service, namespace, cid, "t-1", first.fencing_token)
        replayed = await asyncio.wait_for(duplicate, 10)
        assert isinstance(replayed, AppendRecord) and replayed.version == 1

    async def test_racing_acquisitions_of_one_turn_id_grant_one_lease(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        # Several rounds: without serialization, a round grants two leases more often
        # than not (measured on PostgreSQL), so four rounds per mode rarely all pass.
        for mode, round_ in [
            (m, r) for m in (LeaseMode.SHARED, LeaseMode.QUEUED) for r in range(4)
        ]:
            turn_id = f"dup-{mode.name}-{round_}"
            racing = [
                asyncio.ensure_future(acquire(service, namespace, cid, turn_id, mode))
                for _ in range(8)
            ]

            async def one_granted(racing: list[asyncio.Task[Any]] = racing) -> bool:
                return any(t.done() for t in racing)

            await wait_for(one_granted)
            granted = [t.result() for t in racing if t.done()]
            assert len(granted) == 1 and isinstance(granted[0], TurnLease), granted
            assert all([await pending(t) for t in racing if not t.done()])
            await commit(service, namespace, cid, turn_id, granted[0].fencing_token)
            answers = await asyncio.wait_for(asyncio.gather(*racing), 10)
            assert sum(isinstance(a, TurnLease) for a in answers) == 1
            assert sum(isinstance(a, AppendRecord) for a in answers) == 7

    async def test_an_ended_turn_returns_its_outcome_and_a_released_one_runs_again(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        first = await lease(service, namespace, cid, "t-1")
        duplicate = asyncio.create_task(acquire(service, namespace, cid, "t-1"))
        assert await pending(duplicate)
        ended = EndedTurn([assistant("kept")], Usage(9, 4, 1), "TURN_CONFLICT", {"x": "1"})
        assert await service.leases.release_turn_lease(
            namespace, cid, "t-1", first.fencing_token, ended
        )
        got = await asyncio.wait_for(duplicate, 10)
        assert isinstance(got, EndedTurn)
        assert got.output[0].text == "kept" and got.usage == Usage(9, 4, 1)
        assert (got.reason, dict(got.metadata)) == ("TURN_CONFLICT", {"x": "1"})
        # The same id with another input is refused, ended or not.
        with pytest.raises(DomainError) as caught:
            await acquire(service, namespace, cid, "t-1", payload_hash=b"other")
        assert caught.value.reason == "REQUEST_ID_REUSED"

        # A turn that released without an outcome (no model work) may run again.
        second = await lease(service, namespace, cid, "t-2")
        assert await service.leases.release_turn_lease(
            namespace, cid, "t-2", second.fencing_token, None
        )
        rerun = await lease(service, namespace, cid, "t-2")
        assert rerun.fencing_token != second.fencing_token

    async def test_shared_leases_run_side_by_side_and_the_loser_conflicts(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        a = await lease(service, namespace, cid, "a")
        b = await lease(service, namespace, cid, "b")
        assert not a.exclusive and not b.exclusive
        await service.append(namespace, cid, 0, [user()], "a", Usage(), a.fencing_token)
        with pytest.raises(DomainError) as caught:
            await service.append(namespace, cid, 0, [user()], "b", Usage(), b.fencing_token)
        assert caught.value.reason == "VERSION_CONFLICT"

    async def test_an_exclusive_lease_refuses_other_turns_and_unfenced_appends(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        held = await lease(service, namespace, cid, "owner", mode=LeaseMode.EXCLUSIVE)
        assert held.exclusive
        with pytest.raises(DomainError) as busy:
            await acquire(service, namespace, cid, "other", LeaseMode.EXCLUSIVE)
        assert busy.value.reason == "CONVERSATION_BUSY"
        assert busy.value.metadata == {"running_turn_id": "owner"}
        with pytest.raises(DomainError) as fenced:
            await service.append(namespace, cid, None, [user()], "plain")
        assert fenced.value.reason == "CONVERSATION_BUSY"
        # A shared turn may start, but cannot commit while the exclusive lease holds.
        shared = await lease(service, namespace, cid, "racer")
        with pytest.raises(DomainError) as raced:
            await service.append(
                namespace, cid, 0, [user()], "racer", Usage(), shared.fencing_token
            )
        assert raced.value.reason == "CONVERSATION_BUSY"
        assert await commit(service, namespace, cid, "owner", held.fencing_token) == 1
        # The commit ended the lease: appends go through again.
        await service.append(namespace, cid, None, [user()], "plain")

    async def test_an_exclusive_turn_is_busy_while_a_shared_one_runs(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await lease(service, namespace, cid, "racer")
        with pytest.raises(DomainError) as busy:
            await acquire(service, namespace, cid, "owner", LeaseMode.EXCLUSIVE)
        assert busy.value.metadata == {"running_turn_id": "racer"}

    async def test_queued_turns_are_served_first_come_first_served_and_bounded(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        waiting = metrics.TURNS_WAITING.labels("queue")
        before = waiting._value.get()
        first = await lease(service, namespace, cid, "q-1", mode=LeaseMode.QUEUED)
        second = asyncio.create_task(acquire(service, namespace, cid, "q-2", LeaseMode.QUEUED))
        await wait_for(in_line(waiting, before + 1))  # q-2 holds its place before q-3 asks
        third = asyncio.create_task(acquire(service, namespace, cid, "q-3", LeaseMode.QUEUED))
        await wait_for(in_line(waiting, before + 2))
        with pytest.raises(DomainError) as full:
            await acquire(service, namespace, cid, "q-4", LeaseMode.QUEUED)
        assert full.value.reason == "TURN_QUEUE_FULL"
        assert full.value.retry_after_s is not None
        with pytest.raises(DomainError) as busy:  # REJECT never jumps the line
            await acquire(service, namespace, cid, "r", LeaseMode.EXCLUSIVE)
        assert busy.value.reason == "CONVERSATION_BUSY"

        await commit(service, namespace, cid, "q-1", first.fencing_token)
        granted = await asyncio.wait_for(second, 10)
        assert isinstance(granted, TurnLease) and granted.exclusive
        assert await pending(third), "the third turn waits for the second"
        await commit(service, namespace, cid, "q-2", granted.fencing_token)
        last = await asyncio.wait_for(third, 10)
        assert isinstance(last, TurnLease)

    async def test_a_waiter_that_leaves_gives_up_its_place(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        waiting = metrics.TURNS_WAITING.labels("queue")
        before = waiting._value.get()
        first = await lease(service, namespace, cid, "q-1", mode=LeaseMode.QUEUED)
        leaving = asyncio.create_task(acquire(service, namespace, cid, "q-2", LeaseMode.QUEUED))
        await wait_for(in_line(waiting, before + 1))
        staying = asyncio.create_task(acquire(service, namespace, cid, "q-3", LeaseMode.QUEUED))
        await wait_for(in_line(waiting, before + 2))
        leaving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leaving
        await commit(service, namespace, cid, "q-1", first.fencing_token)
        assert isinstance(await asyncio.wait_for(staying, 10), TurnLease)

    async def test_a_lapsed_lease_is_taken_over_and_its_late_append_refused(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        stale = await lease(service, namespace, cid, "t-1", mode=LeaseMode.EXCLUSIVE, ttl_s=1.0)
        taken: list[TurnLease] = []

        async def taken_over() -> bool:
            try:
                taken.append(await lease(service, namespace, cid, "t-2", mode=LeaseMode.EXCLUSIVE))
            except DomainError as error:
                assert error.reason == "CONVERSATION_BUSY"
                return False
            return True

        await wait_for(taken_over, timeout=15, interval=0.1)
        with pytest.raises(DomainError) as lost:
            await commit(service, namespace, cid, "t-1", stale.fencing_token)
        assert lost.value.reason == "TURN_LEASE_LOST"
        with pytest.raises(DomainError) as renew:
            await service.leases.renew_turn_lease(namespace, cid, "t-1", stale.fencing_token, 30.0)
        assert renew.value.reason == "TURN_LEASE_LOST"
        assert await commit(service, namespace, cid, "t-2", taken[0].fencing_token) == 1

    async def test_the_same_turn_id_takes_over_its_own_lapsed_lease(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        stale = await lease(service, namespace, cid, "t-1", ttl_s=1.0)
        fresh: list[TurnLease | AppendRecord | EndedTurn] = []

        async def retried() -> bool:
            fresh.append(await acquire(service, namespace, cid, "t-1"))
            return True

        await asyncio.wait_for(retried(), 15)  # waits for the lapse, then takes over
        assert isinstance(fresh[0], TurnLease) and fresh[0].fencing_token != stale.fencing_token
        with pytest.raises(DomainError) as lost:
            await commit(service, namespace, cid, "t-1", stale.fencing_token)
        assert lost.value.reason == "TURN_LEASE_LOST"

    async def test_a_turn_that_lost_its_lease_during_its_model_call_is_never_run_again(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        stale = await lease(service, namespace, cid, "t-1", ttl_s=1.0)
        await service.leases.renew_turn_lease(
            namespace, cid, "t-1", stale.fencing_token, 1.0, calling_model=True
        )
        # Its holder stops in the model call and the lease lapses: a repeat of the turn id
        # is not granted the lease (it would run the model a second time).
        first = await asyncio.wait_for(acquire(service, namespace, cid, "t-1"), 15)
        assert isinstance(first, EndedTurn) and first.reason == "TURN_INTERRUPTED"
        assert first.output == () and first.usage == Usage()
        other = await lease(service, namespace, cid, "t-2")
        assert await commit(service, namespace, cid, "t-2", other.fencing_token) == 1
        again = await acquire(service, namespace, cid, "t-1")
        assert isinstance(again, EndedTurn) and again.reason == "TURN_INTERRUPTED"
        with pytest.raises(DomainError) as lost:
            await commit(service, namespace, cid, "t-1", stale.fencing_token)
        assert lost.value.reason == "TURN_LEASE_LOST"

    async def test_a_lease_released_without_an_outcome_after_its_model_call_stays_interrupted(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        held = await lease(service, namespace, cid, "t-1")
        await service.leases.renew_turn_lease(
            namespace, cid, "t-1", held.fencing_token, 30.0, calling_model=True
        )
        # The holder gives up without an outcome (its caller left during the model call,
        # a failure it did not expect): a repeat must not call the model again.
        assert await service.leases.release_turn_lease(
            namespace, cid, "t-1", held.fencing_token, None
        )
        repeat = await acquire(service, namespace, cid, "t-1")
        assert isinstance(repeat, EndedTurn) and repeat.reason == "TURN_INTERRUPTED"
        # Before its model call, a release keeps nothing: the turn id runs again.
        other = await lease(service, namespace, cid, "t-2")
        assert await service.leases.release_turn_lease(
            namespace, cid, "t-2", other.fencing_token, None
        )
        assert isinstance(await acquire(service, namespace, cid, "t-2"), TurnLease)

    async def test_another_turn_keeps_a_lapsed_model_call_interrupted_not_dropped(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        stale = await lease(service, namespace, cid, "t-1", ttl_s=1.0)
        await service.leases.renew_turn_lease(
            namespace, cid, "t-1", stale.fencing_token, 1.0, calling_model=True
        )
        granted: list[TurnLease] = []

        async def exclusive() -> bool:  # granted once t-1's lease lapsed
            try:
                granted.append(
                    await lease(service, namespace, cid, "t-2", mode=LeaseMode.EXCLUSIVE)
                )
            except DomainError as error:
                assert error.reason == "CONVERSATION_BUSY"
                return False
            return True

        await wait_for(exclusive, timeout=15, interval=0.1)
        repeat = await acquire(service, namespace, cid, "t-1")
        assert isinstance(repeat, EndedTurn) and repeat.reason == "TURN_INTERRUPTED"

    async def test_a_waiter_is_not_granted_a_lease_of_the_conversation_made_after_an_erasure(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        await lease(service, namespace, cid, "t-1")
        waiting = metrics.TURNS_WAITING.labels("same_turn")
        before = waiting._value.get()
        repeat = asyncio.ensure_future(acquire(service, namespace, cid, "t-1"))
        await wait_for(in_line(waiting, before + 1))  # a repeat of the running turn waits
        await service.delete_conversation(namespace, cid)
        await service.create_conversation(namespace, cid, {})  # another one, the same id
        # The repeat waited for the turn of the erased conversation: it is not run in the
        # new one (the model would run twice for one turn id).
        with pytest.raises(DomainError) as erased:
            await asyncio.wait_for(repeat, 15)
        assert erased.value.reason == "CONVERSATION_ERASED"
        assert isinstance(await acquire(service, namespace, cid, "t-1"), TurnLease)

    async def test_renewal_keeps_a_lease(self, service: TranscriptService, namespace: str) -> None:
        cid = await new_conversation(service, namespace)
        held = await lease(service, namespace, cid, "t-1", mode=LeaseMode.EXCLUSIVE, ttl_s=5.0)
        renewed = await service.leases.renew_turn_lease(
            namespace, cid, "t-1", held.fencing_token, 60.0
        )
        assert renewed.expire_time > held.expire_time and renewed.exclusive

    async def test_create_if_missing_makes_a_conversation_a_failed_turn_removes(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = str(uuid.uuid4())
        with pytest.raises(DomainError) as missing:
            await acquire(service, namespace, cid, "t-1")
        assert missing.value.reason == "CONVERSATION_NOT_FOUND"
        made = await lease(service, namespace, cid, "t-1", create=True)
        assert made.created
        assert (await service.get_conversation(namespace, cid)).version == 0
        assert await service.leases.release_turn_lease(
            namespace, cid, "t-1", made.fencing_token, None
        )
        with pytest.raises(DomainError) as gone:
            await service.get_conversation(namespace, cid)
        assert gone.value.reason == "CONVERSATION_NOT_FOUND"
        # Committed, it stays.
        made = await lease(service, namespace, cid, "t-2", create=True)
        assert await commit(service, namespace, cid, "t-2", made.fencing_token) == 1
        assert (await service.get_conversation(namespace, cid)).version == 1

    async def test_an_append_needs_the_lease_of_its_own_turn_id(
        self, service: TranscriptService, namespace: str
    ) -> None:
        cid = await new_conversation(service, namespace)
        held = await lease(service, namespace, cid, "t-1")
        with pytest.raises(DomainError) as wrong:
            await service.append(namespace, cid, None, [user()], "t-2", Usage(), held.fencing_token)
        assert wrong.value.reason == "TURN_LEASE_LOST"
        with pytest.raises(DomainError) as no_id:
            await service.append(namespace, cid, None, [user()], "", Usage(), held.fencing_token)
        assert no_id.value.reason == "INVALID_REQUEST_ID"

    async def test_done_turns_are_swept_and_a_committed_turn_id_stays_committed(
        self, store: TranscriptStore, namespace: str
    ) -> None:
        service = make_service(store, turn_outcome_retention_s=0.2)
        cid = await new_conversation(service, namespace)
        first = await lease(service, namespace, cid, "ended")
        ended = EndedTurn([assistant("kept")], Usage(1, 1, 1), "TURN_CONFLICT")
        await service.leases.release_turn_lease(namespace, cid, "ended", first.fencing_token, ended)
        done = await lease(service, namespace, cid, "done")
        await commit(service, namespace, cid, "done", done.fencing_token)

        async def outcome_forgotten() -> bool:
            await store.sweep_turns(100)
            return isinstance(await acquire(service, namespace, cid, "ended"), TurnLease)

        await wait_for(outcome_forgotten, timeout=15, interval=0.1)
        # A committed turn id is answered by its append, swept or not.
        await store.sweep_turns(100)
        assert isinstance(await acquire(service, namespace, cid, "done"), AppendRecord)
