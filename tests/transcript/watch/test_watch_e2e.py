"""WatchConversation through real gRPC servers on real PostgreSQL: replay and live delivery,
resume, turn events, heartbeats, erasure and incarnations, namespaces, limits, shutdown.

Across processes (a writer on one, a watcher on another) and across a PostgreSQL
restart: tests/transcript/watch/test_watch_replicas.py and tests/system/faults/test_watch_faults.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING

import grpc
import pytest
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2

from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs
from services.common.server import RunningServer, serving
from services.common.status import error_info
from services.transcript.component import TranscriptComponent
from services.transcript.config import TranscriptLimits, WatchLimits
from services.transcript.watch.store import PostgresFeedStore
from tests.support.grpc_calls import status_detail, user
from tests.support.settings import server_settings
from tests.support.waiting import wait_for
from tests.transcript.watch.support import Follower, check_exactly_once_in_order, versions_of

if TYPE_CHECKING:
    from runifold.transcript.v1.transcript_service_pb2_grpc import (
        TranscriptServiceAsyncStub as Stub,
    )


def _limits(**watch: float) -> TranscriptLimits:
    return replace(TranscriptLimits(), watch=replace(WatchLimits(), **watch))  # type: ignore[arg-type]


@pytest.fixture
async def quick_server(shared_database_url: str) -> AsyncIterator[RunningServer]:
    """A TranscriptService whose pulse runs every 0.2 s (lapsed leases are seen soon)."""
    async with serving(
        [TranscriptComponent(_limits(poll_s=0.2))],
        server_settings(),
        database_url=shared_database_url,
    ) as running:
        yield running


@pytest.fixture
async def quick(quick_server: RunningServer) -> AsyncIterator[Stub]:
    async with grpc.aio.insecure_channel(quick_server.address) as channel:
        yield stubs.transcript(channel)


async def _create(stub: Stub, namespace: str, conversation_id: str = "") -> pb.Conversation:
    reply = await stub.CreateConversation(
        pb.CreateConversationRequest(namespace=namespace, conversation_id=conversation_id)
    )
    return reply.conversation


async def _append(
    stub: Stub, namespace: str, cid: str, *texts: str, **fields: object
) -> pb.AppendEntriesResponse:
    return await stub.AppendEntries(
        pb.AppendEntriesRequest(
            namespace=namespace,
            conversation_id=cid,
            messages=[user(t) for t in texts],
            **fields,  # type: ignore[arg-type]
        )
    )


def _watch(namespace: str, cid: str, **fields: object) -> pb.WatchConversationRequest:
    return pb.WatchConversationRequest(namespace=namespace, conversation_id=cid, **fields)  # type: ignore[arg-type]


async def test_replays_then_delivers_live_entries_once_each_in_order_with_their_version(
    transcript: Stub, namespace: str
) -> None:
    conversation = await _create(transcript, namespace)
    cid = conversation.conversation_id
    await _append(transcript, namespace, cid, "one", "two", "three")
    await _append(transcript, namespace, cid, "four")
    follower = Follower(transcript, _watch(namespace, cid))
    try:
        await follower.until(lambda f: bool(f.heartbeats()))
        # The replay: one Appended per append, then a Heartbeat (caught up).
        assert follower.kinds() == ["appended", "appended", "heartbeat"]
        first, second = (e.appended for e in follower.of("appended"))
        assert (first.version, first.last_sequence, [e.sequence for e in first.entries]) == (
            1,
            3,
            [1, 2, 3],
        )
        assert (second.version, second.last_sequence) == (2, 4)
        assert {first.incarnation, second.incarnation} == {conversation.incarnation}
        beat = follower.heartbeats()[0]
        assert (beat.version, beat.last_sequence, beat.incarnation) == (
            2,
            4,
            conversation.incarnation,
        )
        # Live: each append as it commits.
        acks = [await _append(transcript, namespace, cid, f"live {i}", "x") for i in range(5)]
        await follower.until_sequence(acks[-1].last_sequence)
        check_exactly_once_in_order(follower.sequences(), 0, 14)
        versions = versions_of(follower)
        for ack in acks:
            for sequence in range(ack.first_sequence, ack.last_sequence + 1):
                assert versions[sequence] == (ack.version, ack.last_sequence)
        assert follower.texts()[4:6] == ["live 0", "x"]
    finally:
        await follower.close()


async def test_a_resumed_stream_continues_without_gap_or_duplicate(
    transcript: Stub, namespace: str
) -> None:
    conversation = await _create(transcript, namespace)
    cid = conversation.conversation_id
    await _append(transcript, namespace, cid, "a", "b", "c")  # version 1: 1..3
    await _append(transcript, namespace, cid, "d", "e")  # version 2: 4..5
    # From inside an append: the rest of it, with its version, then the next.
    inside = Follower(
        transcript, _watch(namespace, cid, after_sequence=2, incarnation=conversation.incarnation)
    )
    try:
        await inside.until(lambda f: bool(f.heartbeats()))
        appended = [e.appended for e in inside.of("appended")]
        assert [
            (a.version, a.last_sequence, [e.sequence for e in a.entries]) for a in appended
        ] == [
            (1, 3, [3]),
            (2, 5, [4, 5]),
        ]
    finally:
        await inside.close()
    # At the end: nothing to replay, then what comes.
    at_end = Follower(transcript, _watch(namespace, cid, after_sequence=5))
    try:
        await at_end.until(lambda f: bool(f.heartbeats()))
        assert at_end.kinds() == ["heartbeat"]
        await _append(transcript, namespace, cid, "f")
        await at_end.until_sequence(6)
        assert at_end.sequences() == [6]
    finally:
        await at_end.close()
    # Beyond the end: refused, with the last sequence.
    beyond = Follower(transcript, _watch(namespace, cid, after_sequence=7))
    await beyond.until_ended()
    assert beyond.error is not None
    assert beyond.error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert beyond.reason() == "SEQUENCE_OUT_OF_RANGE"
    info = error_info(beyond.error)
    assert info is not None and info.metadata["last_sequence"] == "6"


def _retractions(follower: Follower) -> list[tuple[int, list[int]]]:
    return [(e.retracted.version, list(e.retracted.sequences)) for e in follower.of("retracted")]


async def test_a_retraction_of_delivered_entries_is_reported_before_later_entries(
    transcript: Stub, namespace: str
) -> None:
    conversation = await _create(transcript, namespace)
    cid = conversation.conversation_id
    await _append(transcript, namespace, cid, "one", "two", "three")  # version 1
    beats = duration_pb2.Duration(seconds=1)
    follower = Follower(transcript, _watch(namespace, cid, heartbeat_interval=beats))
    try:
        await follower.until(lambda f: bool(f.heartbeats()))
        assert _retractions(follower) == []
        # A write that retracts a delivered entry and adds one: the retraction first.
        undo = await _append(
            transcript, namespace, cid, "two, corrected", expected_version=1, retract_sequences=[2]
        )
        await follower.until_sequence(4)
        assert _retractions(follower) == [(undo.version, [2])]
        kinds = follower.kinds()
        assert kinds.index("retracted") < len(kinds) - 1 - kinds[::-1].index("appended")
        retracted = follower.of("retracted")[0].retracted
        assert retracted.retract_time.seconds > 0
        # A write of retractions alone (no entry): reported, then the stream is caught up
        # at its version.
        alone = await _append(
            transcript, namespace, cid, expected_version=undo.version, retract_sequences=[1, 3]
        )
        await follower.until(lambda f: len(f.of("retracted")) == 2)
        assert _retractions(follower)[1] == (alone.version, [1, 3])
        await follower.until(lambda f: f.heartbeats()[-1].version == alone.version)
    finally:
        await follower.close()
    # A new stream replays the entries with their retractions and reports none again.
    async with Follower(transcript, _watch(namespace, cid)) as fresh:
        await fresh.caught_up()
        assert _retractions(fresh) == []
        marks = {e.sequence: e.retracted_version for e in fresh.of("appended")[0].appended.entries}
        assert marks == {1: alone.version, 2: undo.version, 3: alone.version}


async def test_a_resumed_stream_reports_the_retractions_it_missed(
    transcript: Stub, namespace: str
) -> None:
    conversation = await _create(transcript, namespace)
    cid = conversation.conversation_id
    await _append(transcript, namespace, cid, "a", "b")  # version 1: 1..2
    await _append(transcript, namespace, cid, "c")  # version 2: 3
    # While no stream is open: entry 1 retracted (version 3), then one more entry.
    undo = await _append(transcript, namespace, cid, expected_version=2, retract_sequences=[1])
    await _append(transcript, namespace, cid, "d")  # version 4: 4
    # Resumed after entry 3 (the client saw version 2): the retraction of entry 1, then
    # entry 4.
    resume = _watch(namespace, cid, after_sequence=3, incarnation=conversation.incarnation)
    async with Follower(transcript, resume) as resumed:
        await resumed.caught_up()
        assert resumed.kinds() == ["retracted", "appended", "heartbeat"]
        assert _retractions(resumed) == [(undo.version, [1])]
        assert resumed.sequences() == [4]
    # Resumed after entry 1 itself: entries 2.. come with their marks; the retraction of
    # entry 1 (delivered before) is reported.
    async with Follower(transcript, _watch(namespace, cid, after_sequence=1)) as early:
        await early.caught_up()
        assert _retractions(early) == [(undo.version, [1])]
        assert early.sequences() == [2, 3, 4]


async def test_a_stream_resumed_far_back_reads_the_retractions_a_page_at_a_time(
    shared_database_url: str, namespace: str
) -> None:
    limits = _limits(page_entries=2)
    component = TranscriptComponent(limits)
    async with (
        serving([component], server_settings(), database_url=shared_database_url) as running,
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        stub = stubs.transcript(channel)
        conversation = await _create(stub, namespace)
        cid = conversation.conversation_id
        first = await _append(stub, namespace, cid, "a", "b", "c", "d", "e")  # version 1
        undone, version = [], first.version
        for sequence in range(1, 6):  # five writes, each retracting one entry
            undo = await _append(
                stub, namespace, cid, expected_version=version, retract_sequences=[sequence]
            )
            version = undo.version
            undone.append((version, [sequence]))
        last = await _append(stub, namespace, cid, "f")
        # A read holds at most a page (2) of them...
        assert component.db is not None
        store = PostgresFeedStore(component.db)
        head = await store.open_watch(namespace, uuid.UUID(cid), 5, 0, 60.0, 30.0)
        assert head is not None
        state = await store.read_state(head.key, [], 5, limits.watch.page_entries, 1 << 20)
        assert state is not None and [r.version for r in state.retractions] == [2, 3]
        # ...and the stream reports all five, in order, before the entry after them.
        resume = _watch(namespace, cid, after_sequence=5, incarnation=conversation.incarnation)
        async with Follower(stub, resume) as resumed:
            await resumed.caught_up()
            assert _retractions(resumed) == undone
            assert resumed.kinds() == ["retracted"] * 5 + ["appended", "heartbeat"]
            assert resumed.sequences() == [last.last_sequence]


async def test_a_long_replay_comes_in_bounded_pages_each_entry_once(
    transcript: Stub, namespace: str
) -> None:
    cid = (await _create(transcript, namespace)).conversation_id
    many = await _append(transcript, namespace, cid, *(f"short {i}" for i in range(256)))
    more = await _append(transcript, namespace, cid, *(f"more {i}" for i in range(44)))
    big = "x" * (200 * 1024)
    large = await _append(transcript, namespace, cid, *(f"{i} {big}" for i in range(15)))
    follower = Follower(transcript, _watch(namespace, cid))
    try:
        await follower.until(lambda f: bool(f.heartbeats()))
        check_exactly_once_in_order(follower.sequences(), 0, large.last_sequence)
        versions = versions_of(follower)
        for ack in (many, more, large):
            for sequence in range(ack.first_sequence, ack.last_sequence + 1):
                assert versions[sequence] == (ack.version, ack.last_sequence)
        sizes = [event.ByteSize() for event in follower.of("appended")]
        # The 3 MiB append came in several events of its version, none over about 1 MiB.
        large_events = [e for e in follower.of("appended") if e.appended.version == large.version]
        assert len(large_events) >= 3
        assert max(sizes) < 1024 * 1024
    finally:
        await follower.close()


async def test_a_stream_cut_and_resumed_many_times_sees_every_entry_once(
    transcript: Stub, namespace: str
) -> None:
    cid = (await _create(transcript, namespace)).conversation_id
    writes = asyncio.create_task(_write_many(transcript, namespace, cid, 60))
    seen: list[int] = []
    after = 0
    try:
        while not (writes.done() and after == 60 * 2):
            follower = Follower(transcript, _watch(namespace, cid, after_sequence=after))
            # Read a few events, then drop the connection's stream as a client would.
            await follower.until(
                lambda f: len(f.events) >= 3 or (writes.done() and bool(f.heartbeats()))
            )
            await follower.close()
            got = follower.sequences()
            seen.extend(got)
            after = got[-1] if got else after
    finally:
        await writes
    check_exactly_once_in_order(seen, 0, 120)


async def _write_many(stub: Stub, namespace: str, cid: str, count: int) -> None:
    for i in range(count):
        await _append(stub, namespace, cid, f"m{i}", f"n{i}")


async def test_turns_are_reported_started_and_finished(quick: Stub, namespace: str) -> None:
    cid = (await _create(quick, namespace)).conversation_id
    follower = Follower(quick, _watch(namespace, cid))

    async def acquire(turn_id: str, **fields: object) -> pb.TurnLease:
        reply = await quick.AcquireTurnLease(
            pb.AcquireTurnLeaseRequest(
                namespace=namespace,
                conversation_id=cid,
                turn_id=turn_id,
                **fields,  # type: ignore[arg-type]
            )
        )
        await follower.until(
            lambda f: turn_id in [e.turn_started.turn_id for e in f.of("turn_started")]
        )
        return reply.lease

    def finished(turn_id: str) -> pb.TurnFinished | None:
        for event in follower.of("turn_finished"):
            if event.turn_finished.turn_id == turn_id:
                return event.turn_finished
        return None

    try:
        await follower.until(lambda f: bool(f.heartbeats()))
        # Committed: the entries first, then the finish with the version.
        lease = await acquire("committed")
        ack = await _append(
            quick,
            namespace,
            cid,
            "answer",
            request_id="committed",
            fencing_token=lease.fencing_token,
        )
        await follower.until(lambda f: finished("committed") is not None)
        assert follower.kinds().index("appended") < follower.kinds().index("turn_finished")
        done = finished("committed")
        assert done is not None
        assert (done.finish, done.version) == (pb.TURN_FINISH_COMMITTED, ack.version)
        started = follower.of("turn_started")[0].turn_started
        assert started.exclusive is False and started.start_time.seconds > 0
        # Ended with an outcome: its reason.
        lease = await acquire("ended", mode=pb.TURN_LEASE_MODE_EXCLUSIVE)
        assert follower.of("turn_started")[-1].turn_started.exclusive is True
        await quick.ReleaseTurnLease(
            pb.ReleaseTurnLeaseRequest(
                namespace=namespace,
                conversation_id=cid,
                turn_id="ended",
                fencing_token=lease.fencing_token,
                ended=pb.EndedTurn(reason="TURN_CONFLICT"),
            )
        )
        await follower.until(lambda f: finished("ended") is not None)
        done = finished("ended")
        assert done is not None and (done.finish, done.reason) == (
            pb.TURN_FINISH_ENDED,
            "TURN_CONFLICT",
        )
        # Released without an outcome.
        lease = await acquire("released")
        await quick.ReleaseTurnLease(
            pb.ReleaseTurnLeaseRequest(
                namespace=namespace,
                conversation_id=cid,
                turn_id="released",
                fencing_token=lease.fencing_token,
            )
        )
        await follower.until(lambda f: finished("released") is not None)
        done = finished("released")
        assert done is not None and done.finish == pb.TURN_FINISH_RELEASED
        # A lease nobody renews lapses: no write tells anyone, the pulse sees it.
        await acquire("lapsed", ttl=duration_pb2.Duration(seconds=1))
        await follower.until(lambda f: finished("lapsed") is not None)
        done = finished("lapsed")
        assert done is not None and done.finish == pb.TURN_FINISH_LAPSED
        assert len(follower.of("turn_started")) == len(follower.of("turn_finished")) == 4
    finally:
        await follower.close()


async def test_a_quiet_stream_gets_heartbeats_at_its_interval(quick: Stub, namespace: str) -> None:
    conversation = await _create(quick, namespace)
    await _append(quick, namespace, conversation.conversation_id, "hello")
    interval = duration_pb2.Duration()
    interval.FromTimedelta(timedelta(seconds=1))
    follower = Follower(
        quick, _watch(namespace, conversation.conversation_id, heartbeat_interval=interval)
    )
    try:
        await follower.until(lambda f: len(f.heartbeats()) >= 4)
        beats = follower.heartbeats()
        assert {(b.version, b.last_sequence, b.incarnation) for b in beats} == {
            (1, 1, conversation.incarnation)
        }
        times = [b.read_time.ToDatetime() for b in beats]
        assert times == sorted(times) and times[-1] > times[0]  # the pulse looked again
        assert follower.kinds() == ["appended"] + ["heartbeat"] * len(beats)
    finally:
        await follower.close()


async def test_erasure_ends_the_stream_and_a_recreated_id_is_a_new_incarnation(
    transcript: Stub, namespace: str
) -> None:
    old = await _create(transcript, namespace)
    cid = old.conversation_id
    await _append(transcript, namespace, cid, "a", "b", "c")
    follower = Follower(transcript, _watch(namespace, cid))
    await follower.until(lambda f: bool(f.heartbeats()))
    await transcript.DeleteConversation(
        pb.DeleteConversationRequest(namespace=namespace, conversation_id=cid)
    )
    await follower.until_ended()
    assert follower.error is None, follower.error
    assert follower.kinds()[-1] == "erased"
    assert follower.events[-1].erased.incarnation == old.incarnation

    # Erased and not made again: NOT_FOUND, as GetConversation says.
    gone = Follower(transcript, _watch(namespace, cid, incarnation=old.incarnation))
    await gone.until_ended()
    assert gone.error is not None and gone.error.code() == grpc.StatusCode.NOT_FOUND

    # Made again with the same id: a resume token of the old one replays nothing of it.
    new = await _create(transcript, namespace, cid)
    assert new.incarnation != old.incarnation
    await _append(transcript, namespace, cid, "new one", "new two", "new three", "new four")
    for after in (0, 3):
        stale = Follower(
            transcript, _watch(namespace, cid, after_sequence=after, incarnation=old.incarnation)
        )
        await stale.until_ended()
        assert stale.error is None, stale.error
        assert stale.kinds() == ["erased"]
        assert stale.events[0].erased.incarnation == old.incarnation
    fresh = Follower(transcript, _watch(namespace, cid, incarnation=new.incarnation))
    try:
        await fresh.until(lambda f: bool(f.heartbeats()))
        assert fresh.texts() == ["new one", "new two", "new three", "new four"]
        assert fresh.heartbeats()[0].incarnation == new.incarnation
    finally:
        await fresh.close()


async def test_another_namespaces_conversation_is_not_found_exactly_as_get_conversation(
    transcript: Stub, namespace: str
) -> None:
    cid = (await _create(transcript, namespace)).conversation_id
    await _append(transcript, namespace, cid, "secret")
    other = f"{namespace}-other"
    outcomes = []
    for conversation_id in (cid, str(uuid.uuid4())):  # theirs, and one that never existed
        follower = Follower(transcript, _watch(other, conversation_id, after_sequence=1))
        await follower.until_ended()
        assert follower.error is not None and follower.events == []
        with pytest.raises(grpc.aio.AioRpcError) as got:
            await transcript.GetConversation(
                pb.GetConversationRequest(namespace=other, conversation_id=conversation_id)
            )
        for error in (follower.error, got.value):
            info = error_info(error)
            assert info is not None
            outcomes.append((error.code(), error.details(), info.reason, dict(info.metadata)))
    assert len(set(map(str, outcomes))) == 1
    assert outcomes[0][0] == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("fields", "reason", "field"),
    [
        ({"after_sequence": -1}, "INVALID_SEQUENCE", "after_sequence"),
        ({"incarnation": -1}, "INVALID_INCARNATION", "incarnation"),
        (
            {"heartbeat_interval": duration_pb2.Duration(nanos=500_000_000)},
            "INVALID_HEARTBEAT_INTERVAL",
            "heartbeat_interval",
        ),
        (
            {"heartbeat_interval": duration_pb2.Duration(seconds=301)},
            "INVALID_HEARTBEAT_INTERVAL",
            "heartbeat_interval",
        ),
        ({"conversation_id": "not-a-uuid"}, "INVALID_CONVERSATION_ID", "conversation_id"),
    ],
)
async def test_invalid_requests_are_refused_with_the_field(
    transcript: Stub, namespace: str, fields: dict[str, object], reason: str, field: str
) -> None:
    cid = (await _create(transcript, namespace)).conversation_id
    request = _watch(namespace, cid)
    for name, value in fields.items():
        if isinstance(value, duration_pb2.Duration):
            getattr(request, name).CopyFrom(value)
        else:
            setattr(request, name, value)
    follower = Follower(transcript, request)
    await follower.until_ended()
    assert follower.error is not None
    assert follower.error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert follower.reason() == reason
    violation = status_detail(follower.error, error_details_pb2.BadRequest).field_violations[0]
    assert violation.field == field


async def test_watchers_beyond_the_limits_are_refused_with_a_retry_delay(
    shared_database_url: str, namespace: str
) -> None:
    limits = _limits(max_watchers=3, max_watchers_per_namespace=2, retry_after_s=7.0)
    async with (
        serving(
            [TranscriptComponent(limits)], server_settings(), database_url=shared_database_url
        ) as running,
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        stub = stubs.transcript(channel)
        other = f"{namespace}-b"
        third = f"{namespace}-c"
        ids = {ns: (await _create(stub, ns)).conversation_id for ns in (namespace, other, third)}

        async def open_one(ns: str) -> Follower:
            follower = Follower(stub, _watch(ns, ids[ns]))
            await follower.until(lambda f: bool(f.heartbeats()) or f.ended)
            return follower

        def refused(follower: Follower, scope: str, limit: int) -> None:
            assert follower.error is not None, follower.kinds()
            assert follower.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            info = error_info(follower.error)
            assert info is not None and info.reason == "WATCHER_LIMIT"
            assert dict(info.metadata) == {"scope": scope, "limit": str(limit)}
            delay = status_detail(follower.error, error_details_pb2.RetryInfo).retry_delay
            assert delay.ToTimedelta() == timedelta(seconds=7)

        open_ = [await open_one(namespace), await open_one(namespace)]
        assert all(not f.ended for f in open_)
        refused(await open_one(namespace), "namespace", 2)
        open_.append(await open_one(other))
        assert not open_[-1].ended
        refused(await open_one(third), "process", 3)
        # A stream that ends gives its place back.
        await open_[0].close()
        again = await open_one(namespace)
        try:
            assert not again.ended and again.heartbeats()
        finally:
            for follower in [*open_[1:], again]:
                await follower.close()


async def test_shutdown_ends_streams_with_a_status_clients_resume_from(
    shared_database_url: str, namespace: str
) -> None:
    settings = server_settings(RUNIFOLD_SHUTDOWN_GRACE_S="30")
    async with (
        serving([TranscriptComponent()], settings, database_url=shared_database_url) as running,
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        stub = stubs.transcript(channel)
        cid = (await _create(stub, namespace)).conversation_id
        follower = Follower(stub, _watch(namespace, cid))
        await follower.until(lambda f: bool(f.heartbeats()))
        stopping = asyncio.create_task(running.stop(grace=30))
        await follower.until_ended()
        assert follower.error is not None
        assert follower.error.code() == grpc.StatusCode.UNAVAILABLE
        assert follower.reason() == "SERVER_SHUTTING_DOWN"
        await stopping


async def test_the_python_client_resumes_across_a_server_restart(
    shared_database_url: str, transcript_server: RunningServer, namespace: str
) -> None:
    from runifold_client import AsyncClient

    # Writes go through another replica (the fixture's), which stays up throughout.
    writer = AsyncClient(transcript_server.address, namespace=namespace)
    cid = (await writer.create_conversation()).conversation_id
    for text in ("one", "two"):
        await writer.append(cid, [text])
    keeps = await writer.acquire_turn_lease(cid, "keeps-running")
    goes = await writer.acquire_turn_lease(cid, "finishes-while-down")
    events: list[pb.WatchConversationResponse] = []

    def kinds() -> list[str]:
        return [str(e.WhichOneof("event")) for e in events]

    def sequences() -> list[int]:
        return [s.sequence for e in events for s in e.appended.entries]

    async with serving(
        [TranscriptComponent()], server_settings(), database_url=shared_database_url
    ) as first:
        port = first.port
        watcher = AsyncClient(f"127.0.0.1:{port}", namespace=namespace)

        async def follow() -> None:
            async for event in watcher.watch_conversation(cid):
                events.append(event)

        following = asyncio.create_task(follow())

        async def reached(predicate: Callable[[], bool]) -> None:
            async def holds() -> bool:
                return predicate() or following.done()

            await wait_for(holds, timeout=30, interval=0.01)
            assert predicate(), (kinds(), following)

        await reached(lambda: kinds().count("turn_started") == 2 and "heartbeat" in kinds())
        # Entry 1 retracted: reported once now, and not again by the resumed stream
        # (which the server starts with the retractions after entry 2's version).
        version = (await writer.get_conversation(cid)).version
        first_undo = await writer.append(cid, [], expected_version=version, retract_sequences=[1])
        await reached(lambda: "retracted" in kinds())
        # The watcher's server goes away (its streams end with UNAVAILABLE) ...
        await first.stop(grace=5)
    # ... and while it is down, one turn ends and entry 2 is retracted.
    await writer.release_turn_lease(cid, "finishes-while-down", goes.lease.fencing_token)
    second_undo = await writer.append(
        cid, [], expected_version=first_undo.version, retract_sequences=[2]
    )
    async with serving(
        [TranscriptComponent()],
        server_settings(RUNIFOLD_LISTEN=f"127.0.0.1:{port}"),
        database_url=shared_database_url,
    ):
        await writer.append(cid, ["three"])
        await reached(
            lambda: (
                3 in sequences() and "turn_finished" in kinds() and kinds().count("retracted") >= 2
            )
        )
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
    await writer.release_turn_lease(cid, "keeps-running", keeps.lease.fencing_token)
    await watcher.close()
    await writer.close()
    assert sequences() == [1, 2, 3]
    retracted = [
        (e.retracted.version, list(e.retracted.sequences))
        for e in events
        if e.HasField("retracted")
    ]
    assert retracted == [(first_undo.version, [1]), (second_undo.version, [2])]
    started = [e.turn_started.turn_id for e in events if e.HasField("turn_started")]
    assert sorted(started) == ["finishes-while-down", "keeps-running"]  # neither twice
    finished = [e.turn_finished for e in events if e.HasField("turn_finished")]
    assert [(f.turn_id, f.finish) for f in finished] == [
        ("finishes-while-down", pb.TURN_FINISH_UNSPECIFIED)
    ]
