"""Waits that one namespace can fill: turns waiting for their lease, and lease waiters.

Each test runs the services as their own processes (`python -m services.transcript`,
`python -m services.agent`), a fake OpenAI-compatible model that holds and counts calls,
and two namespaces: one that floods, one that is measured.

- Waiting turns are counted: a namespace that makes many ENQUEUE turns wait behind
  leases it holds, then lets every lease go at once, never has more model calls in
  flight than its turn limit, and another namespace's turn reaches the model meanwhile.
- Lease waiters are bounded and do not poll: callers beyond the per-conversation limit
  are refused with RetryInfo; the waiting ones try again only when woken (or at the
  safety-net poll); the turn they wait for commits, and every waiter gets its outcome.
- A waiter on one replica is woken by a release through another (NOTIFY), not by its poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from runifold.agent.v1 import agent_service_pb2 as agent_pb
from runifold.transcript.v1 import transcript_service_pb2 as pb
from services.common import stubs
from tests.support.fake_openai import FakeOpenAI, FakeReply, fake_openai
from tests.support.grpc_calls import reason, user
from tests.support.process import ServiceProcess, service_process, value
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

TURN_LIMIT = 2
FLOODED = 6  # conversations the flooding namespace makes wait (> TURN_LIMIT)


class CountingModel:
    """The fake model: holds the calls of the flooding namespace until `release`, answers
    the others at once, and records the most flooding calls it had in flight at once."""

    def __init__(self, model: FakeOpenAI, held_prefix: str) -> None:
        self.held_prefix = held_prefix
        self.release = asyncio.Event()
        self.in_flight = 0
        self.peak = 0
        self.answered: list[str] = []
        model.respond_with(self._respond)

    async def _respond(self, body: Any) -> FakeReply:
        text = str(body["messages"][-1]["content"])
        if text.startswith(self.held_prefix):
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            try:
                await asyncio.wait_for(self.release.wait(), 120)
            finally:
                self.in_flight -= 1
        self.answered.append(text)
        return FakeReply(text=f"answer to {text}", usage=(10, 3))


@contextlib.asynccontextmanager
async def transcript(
    database_url: str, data_dir: Path, **env: str
) -> AsyncIterator[ServiceProcess]:
    async with service_process(
        "services.transcript", {"DATABASE_URL": database_url, **env}, data_dir
    ) as process:
        yield process


@contextlib.asynccontextmanager
async def agent(
    database_url: str, transcript_address: str, model: FakeOpenAI, data_dir: Path, **env: str
) -> AsyncIterator[ServiceProcess]:
    """An agent process, with a summary process of its own (no background workers)."""
    summary_env = {
        "DATABASE_URL": database_url,
        "TRANSCRIPT_SERVICE_ADDR": transcript_address,
        "RUNIFOLD_SUMMARY_WORKERS": "0",
    }
    async with service_process("services.summary", summary_env, data_dir / "s") as summaries:
        settings = {
            "TRANSCRIPT_SERVICE_ADDR": transcript_address,
            "SUMMARY_SERVICE_ADDR": summaries.address,
            "MEMORY_SERVICE_ADDR": "127.0.0.1:9",  # these turns recall nothing
            "RUNIFOLD_AGENT_MODEL_URL": model.base_url,
            "RUNIFOLD_AGENT_MODEL_NAME": "fake-model",
            "RUNIFOLD_AGENT_MODEL_MAX_RETRIES": "0",
            **env,
        }
        async with service_process("services.agent", settings, data_dir / "a") as process:
            yield process


def enqueued_turn(namespace: str, cid: str, text: str) -> agent_pb.RunConversationRequest:
    return agent_pb.RunConversationRequest(
        namespace=namespace,
        conversation_id=cid,
        input=[user(text)],
        turn_id=f"turn-{uuid.uuid4().hex}",
        concurrency=agent_pb.CONCURRENCY_MODE_ENQUEUE,
    )


async def test_waiting_turns_never_exceed_the_namespace_limit_when_their_waits_end_together(
    fresh_database_url: str, tmp_path: Path
) -> None:
    flooding, quiet = f"flood-{uuid.uuid4().hex[:6]}", f"quiet-{uuid.uuid4().hex[:6]}"
    async with fake_openai() as fake:
        model = CountingModel(fake, held_prefix="flood")
        async with (
            transcript(fresh_database_url, tmp_path / "t") as transcripts,
            agent(
                fresh_database_url,
                transcripts.address,
                fake,
                tmp_path / "a",
                RUNIFOLD_NAMESPACE_MAX_TURNS=str(TURN_LIMIT),
                # As many model slots as the flood has turns: before waiting turns were
                # counted, the flood took them all and the quiet namespace's turn waited.
                RUNIFOLD_AGENT_MODEL_MAX_CONCURRENT=str(FLOODED),
            ) as agents,
            grpc.aio.insecure_channel(transcripts.address) as to_transcripts,
            grpc.aio.insecure_channel(agents.address) as to_agents,
        ):
            leases, turns = stubs.transcript(to_transcripts), stubs.agent(to_agents)
            holds = []
            for index in range(FLOODED):
                created = await leases.CreateConversation(
                    pb.CreateConversationRequest(namespace=flooding)
                )
                cid = created.conversation.conversation_id
                lease = await leases.AcquireTurnLease(
                    pb.AcquireTurnLeaseRequest(
                        namespace=flooding,
                        conversation_id=cid,
                        turn_id=f"hold-{index}",
                        mode=pb.TURN_LEASE_MODE_EXCLUSIVE,
                    )
                )
                holds.append((cid, f"hold-{index}", lease.lease.fencing_token))
            # One turn after another, each once the one before waits (parked, its turn
            # slot free again): a namespace can make many more turns wait than its limit.
            waiting: list[asyncio.Future[agent_pb.RunConversationResponse]] = []

            async def parked() -> bool:
                metrics = await agents.scrape()
                count = value(metrics, "runifold_admitted_in_flight", resource="turn_wait")
                return count == len(waiting)

            for index, (cid, _, _) in enumerate(holds):
                waiting.append(
                    asyncio.ensure_future(
                        turns.RunConversation(
                            enqueued_turn(flooding, cid, f"flood {index}"), timeout=120
                        )
                    )
                )
                await wait_for(parked, timeout=60)
            # Every wait ends at once.
            await asyncio.gather(
                *(
                    leases.ReleaseTurnLease(
                        pb.ReleaseTurnLeaseRequest(
                            namespace=flooding,
                            conversation_id=cid,
                            turn_id=turn_id,
                            fencing_token=token,
                        )
                    )
                    for cid, turn_id, token in holds
                )
            )

            async def at_the_limit() -> bool:
                return model.in_flight == TURN_LIMIT

            await wait_for(at_the_limit, timeout=60)
            # The quiet namespace's turn reaches the model and commits while the flood's
            # calls are held.
            created = await leases.CreateConversation(pb.CreateConversationRequest(namespace=quiet))
            answer = await turns.RunConversation(
                enqueued_turn(quiet, created.conversation.conversation_id, "quiet hello"),
                timeout=60,
            )
            assert answer.conversation_version == 1
            assert model.peak == TURN_LIMIT, "a waiting turn came back over the limit"
            model.release.set()
            done = await asyncio.gather(*waiting)
        assert all(result.conversation_version == 1 for result in done)
        assert model.peak == TURN_LIMIT


async def _lease(
    stub: Any, namespace: str, cid: str, turn_id: str, **fields: Any
) -> pb.AcquireTurnLeaseResponse:
    response: pb.AcquireTurnLeaseResponse = await stub.AcquireTurnLease(
        pb.AcquireTurnLeaseRequest(
            namespace=namespace, conversation_id=cid, turn_id=turn_id, **fields
        ),
        timeout=60,
    )
    return response


async def test_lease_waiters_are_bounded_and_woken_not_polling(
    fresh_database_url: str, tmp_path: Path
) -> None:
    namespace, other = f"wait-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"
    per_conversation = 8
    async with (
        transcript(
            fresh_database_url,
            tmp_path / "t",
            RUNIFOLD_TURN_MAX_WAITERS_PER_CONVERSATION=str(per_conversation),
            RUNIFOLD_TURN_WAIT_POLL_S="5",
        ) as server,
        grpc.aio.insecure_channel(server.address) as channel,
    ):
        stub = stubs.transcript(channel)
        cid = (
            await stub.CreateConversation(pb.CreateConversationRequest(namespace=namespace))
        ).conversation.conversation_id
        running = (await _lease(stub, namespace, cid, "the-turn")).lease
        # Repeats of the running turn id wait for its outcome; the ones beyond the limit
        # are refused at once, with a retry delay.
        repeats = [
            asyncio.ensure_future(_lease(stub, namespace, cid, "the-turn")) for _ in range(20)
        ]

        async def settled() -> bool:
            metrics = await server.scrape()
            refused = sum(1 for r in repeats if r.done())
            return value(metrics, "runifold_turns_waiting") == per_conversation and (
                refused == len(repeats) - per_conversation
            )

        await wait_for(settled, timeout=60)
        waiting = [r for r in repeats if not r.done()]
        for refused in [r for r in repeats if r.done()]:
            error = refused.exception()
            assert isinstance(error, grpc.aio.AioRpcError)
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert reason(error) == "TURN_WAITERS_LIMIT"
            assert any(key == "grpc-status-details-bin" for key, _ in error.trailing_metadata())
        # Waiting costs nothing while nothing changes: another namespace is served, and
        # the waiters do not try again until the safety net (5 s) or a change.
        before = value(await server.scrape(), "runifold_turn_lease_retries_total")
        other_cid = (
            await stub.CreateConversation(pb.CreateConversationRequest(namespace=other))
        ).conversation.conversation_id
        await stub.GetConversation(
            pb.GetConversationRequest(namespace=other, conversation_id=other_cid)
        )
        # The turn they wait for commits (quoting its fencing token); each waiter is woken
        # by it and answered with its outcome.
        appended = await stub.AppendEntries(
            pb.AppendEntriesRequest(
                namespace=namespace,
                conversation_id=cid,
                messages=[user("question"), user("answer")],
                request_id="the-turn",
                fencing_token=running.fencing_token,
                expected_version=0,
            )
        )
        answers = await asyncio.gather(*waiting)
        assert len(answers) == per_conversation
        assert all(a.committed.version == appended.version == 1 for a in answers)
        metrics = await server.scrape()
        assert value(metrics, "runifold_turn_lease_retries_total", cause="poll") == 0
        # One try per waiter for the change, at most a few more: no loop every 50 ms.
        retries = value(metrics, "runifold_turn_lease_retries_total") - before
        assert per_conversation <= retries <= 3 * per_conversation


async def test_a_waiter_on_one_replica_is_woken_by_a_release_through_another(
    fresh_database_url: str, tmp_path: Path
) -> None:
    namespace = f"replica-{uuid.uuid4().hex[:6]}"
    async with (
        # The waiting replica's safety net is as slow as it may be: what wakes the
        # waiter can only be the other replica's notification.
        transcript(fresh_database_url, tmp_path / "a", RUNIFOLD_TURN_WAIT_POLL_S="5") as waits,
        transcript(fresh_database_url, tmp_path / "b") as holds,
        grpc.aio.insecure_channel(waits.address) as to_waits,
        grpc.aio.insecure_channel(holds.address) as to_holds,
    ):
        waiter, holder = stubs.transcript(to_waits), stubs.transcript(to_holds)
        cid = (
            await holder.CreateConversation(pb.CreateConversationRequest(namespace=namespace))
        ).conversation.conversation_id
        first = (
            await _lease(holder, namespace, cid, "first", mode=pb.TURN_LEASE_MODE_EXCLUSIVE)
        ).lease
        queued = asyncio.ensure_future(
            _lease(waiter, namespace, cid, "second", mode=pb.TURN_LEASE_MODE_QUEUED)
        )

        async def queued_there() -> bool:
            return value(await waits.scrape(), "runifold_turns_waiting", why="queue") == 1

        await wait_for(queued_there, timeout=30)
        await holder.ReleaseTurnLease(
            pb.ReleaseTurnLeaseRequest(
                namespace=namespace,
                conversation_id=cid,
                turn_id="first",
                fencing_token=first.fencing_token,
            )
        )
        granted = await queued
        assert granted.HasField("lease") and granted.lease.exclusive
        metrics = await waits.scrape()
        assert value(metrics, "runifold_turn_lease_retries_total", cause="woken") >= 1
        assert value(metrics, "runifold_turn_lease_retries_total", cause="poll") == 0
