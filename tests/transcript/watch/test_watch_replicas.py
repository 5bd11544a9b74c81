"""WatchConversation across replicas: two TranscriptService processes (`python -m
services.transcript`) on one database, writers on one, watchers on the other.

The watching process's pulse is set to an hour, so that what it delivers can only
have come through PostgreSQL's LISTEN/NOTIFY from the writing process.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import grpc

from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs
from tests.support.grpc_calls import user
from tests.support.process import service_process, value
from tests.transcript.watch.support import Follower, check_exactly_once_in_order, versions_of

WRITERS = 4
APPENDS = 25


async def test_a_watcher_on_one_replica_sees_every_append_of_racing_writers_on_another(
    fresh_database_url: str, tmp_path: Path
) -> None:
    namespace = f"replicas-{uuid.uuid4().hex[:8]}"
    base = {"DATABASE_URL": fresh_database_url}
    async with (
        service_process(
            "services.transcript", {**base, "RUNIFOLD_WATCH_POLL_S": "3600"}, tmp_path / "a"
        ) as watching,
        service_process("services.transcript", base, tmp_path / "b") as writing,
        grpc.aio.insecure_channel(watching.address) as to_watching,
        grpc.aio.insecure_channel(writing.address) as to_writing,
    ):
        watcher, writer = stubs.transcript(to_watching), stubs.transcript(to_writing)
        created = await writer.CreateConversation(pb.CreateConversationRequest(namespace=namespace))
        conversation = created.conversation
        cid = conversation.conversation_id
        request = pb.WatchConversationRequest(namespace=namespace, conversation_id=cid)
        follower = Follower(watcher, request)
        await follower.until(lambda f: bool(f.heartbeats()))
        assert value(await watching.scrape(), "runifold_watchers") == 1

        acks: dict[int, list[pb.AppendEntriesResponse]] = {}
        # A second stream on the watching replica, cut after a few events and resumed on
        # the writing one: together they must hold every entry once.
        cut = Follower(watcher, request)

        async def write(index: int) -> None:
            acks[index] = []
            for i in range(APPENDS):
                acks[index].append(
                    await writer.AppendEntries(
                        pb.AppendEntriesRequest(
                            namespace=namespace,
                            conversation_id=cid,
                            messages=[user(f"w{index}-{i}-a"), user(f"w{index}-{i}-b")],
                        )
                    )
                )

        await asyncio.gather(*(write(index) for index in range(WRITERS)))
        last = WRITERS * APPENDS * 2
        await cut.until(lambda f: len(f.sequences()) >= 10)
        await cut.close()
        first_part = cut.sequences()
        resumed = Follower(
            writer,
            pb.WatchConversationRequest(
                namespace=namespace,
                conversation_id=cid,
                after_sequence=first_part[-1],
                incarnation=cut.of("appended")[-1].appended.incarnation,
            ),
        )
        await follower.until_sequence(last)
        await resumed.until_sequence(last)

        # Every entry once, in order, each with the version its writer was told.
        check_exactly_once_in_order(follower.sequences(), 0, last)
        versions = versions_of(follower)
        for replies in acks.values():
            for ack in replies:
                for sequence in range(ack.first_sequence, ack.last_sequence + 1):
                    assert versions[sequence] == (ack.version, ack.last_sequence)
        texts = follower.texts()
        for index in range(WRITERS):
            mine = [t for t in texts if t.startswith(f"w{index}-")]
            assert mine == [f"w{index}-{i}-{part}" for i in range(APPENDS) for part in "ab"]
        check_exactly_once_in_order([*first_part, *resumed.sequences()], 0, last)
        await resumed.close()

        # A retraction through the writing replica reaches the watching one (NOTIFY),
        # before the entry of the same write.
        head = max(ack.version for replies in acks.values() for ack in replies)
        undo = await writer.AppendEntries(
            pb.AppendEntriesRequest(
                namespace=namespace,
                conversation_id=cid,
                expected_version=head,
                retract_sequences=[2, 5],
                messages=[user("corrected")],
            )
        )
        await follower.until_sequence(last + 1)
        retracted = [e.retracted for e in follower.of("retracted")]
        assert [(r.version, list(r.sequences)) for r in retracted] == [(undo.version, [2, 5])]
        assert [k for k in follower.kinds() if k != "heartbeat"][-2:] == ["retracted", "appended"]

        # The erasure through the writing replica ends the stream on the watching one.
        await writer.DeleteConversation(
            pb.DeleteConversationRequest(namespace=namespace, conversation_id=cid)
        )
        await follower.until_ended()
        assert follower.error is None, follower.error
        assert follower.kinds()[-1] == "erased"
        assert follower.events[-1].erased.incarnation == conversation.incarnation

        scraped = await watching.scrape()
        assert value(scraped, "runifold_watchers") == 0
        assert value(scraped, "runifold_watch_events_total", event="erased") == 1
        assert value(scraped, "runifold_watch_events_total", event="retracted") == 1
        assert value(scraped, "runifold_watch_delivery_seconds_count") >= WRITERS * APPENDS / 2
