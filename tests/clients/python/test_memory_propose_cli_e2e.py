"""The curation workflow from the Python client and the `runifold memory propose` command,
against a real server (TranscriptService and MemoryService, the offline proposer, the real
embedding model and Qdrant Edge)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from runifold.memory.v1 import memory_service_pb2 as pb
from runifold_client import AsyncClient
from runifold_client.cli import UsageError, _picked, main
from services.common.server import RunningServer
from services.memory.component import MemoryComponent
from tests.memory.support import memory_config, memory_server, outbox_drained
from tests.support.waiting import wait_for


@pytest.fixture
async def served(
    shared_database_url: str, tmp_path: Path
) -> AsyncIterator[tuple[RunningServer, MemoryComponent]]:
    async with memory_server(shared_database_url, memory_config(tmp_path)) as running:
        yield running


async def propose(
    capsys: pytest.CaptureFixture[str], address: str, namespace: str, *args: str
) -> dict[str, Any]:
    """Run the command (its blocking client in a thread, so the server keeps serving)."""
    argv = ["memory", "propose", *args, "--namespace", namespace, "--target", address, "--json"]
    status = await asyncio.to_thread(main, argv)
    output = capsys.readouterr().out
    assert status == 0, output
    document: dict[str, Any] = json.loads(output)
    return document


async def test_propose_show_then_confirm_then_supersede(
    served: tuple[RunningServer, MemoryComponent],
    namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    running, component = served
    async with AsyncClient(running.address, namespace=namespace) as client:
        cid = (await client.create_conversation()).conversation_id
        await client.append(cid, "I live in Paris.")
        await client.append(cid, "I'm allergic to peanuts.")
        # Shown, not stored.
        shown = await propose(
            capsys, running.address, namespace, cid, "--from", "1", "--through", "2"
        )
        assert [p["content"] for p in shown["proposals"]] == [
            "The user lives in Paris.",
            "The user is allergic to peanuts.",
        ]
        assert shown["stored"] == []
        assert (await client.search_memories("where does the user live")).results == []
        # --yes stores them.
        stored = await propose(
            capsys, running.address, namespace, cid, "--from", "1", "--through", "2", "--yes"
        )
        assert [m["content"] for m in stored["stored"]] == [
            "The user lives in Paris.",
            "The user is allergic to peanuts.",
        ]
        paris = stored["stored"][0]["memory_id"]
        await wait_for(lambda: outbox_drained(component))
        # A newer statement: proposed as superseding Paris, confirmed as such.
        await client.append(cid, "I moved to Berlin.")
        moved = await propose(
            capsys, running.address, namespace, cid, "--from", "3", "--through", "3", "--yes"
        )
        assert [(p["action"], p["related_memory_ids"]) for p in moved["proposals"]] == [
            ("PROPOSAL_ACTION_SUPERSEDE", [paris])
        ]
        history = [r async for r in client.memory_revisions(paris)]
        assert [(r.revision, r.reason) for r in history] == [(1, "create"), (2, "superseded")]
        assert history[1].superseded_by == moved["stored"][0]["memory_id"]
        await wait_for(lambda: outbox_drained(component))
        # Proposing the old range again stores nothing: peanuts is a duplicate, and Paris,
        # said before Berlin, cannot supersede it (dropped).
        again = await propose(
            capsys, running.address, namespace, cid, "--from", "1", "--through", "2", "--yes"
        )
        assert [p["action"] for p in again["proposals"]] == ["PROPOSAL_ACTION_DUPLICATE"]
        assert again["dropped_count"] == 1 and again["stored"] == []
        found = await client.search_memories("where does the user live", limit=1)
        assert [r.memory.content for r in found.results] == ["The user lives in Berlin."]


async def test_the_client_confirms_a_proposal_and_refuses_a_duplicate(
    served: tuple[RunningServer, MemoryComponent], namespace: str
) -> None:
    running, component = served
    async with AsyncClient(running.address, namespace=namespace) as client:
        cid = (await client.create_conversation()).conversation_id
        await client.append(cid, "My name is Dana.")
        reply = await client.propose_memories(cid, from_sequence=1, through_sequence=1)
        (proposal,) = reply.proposals
        written = await client.confirm_proposal(proposal)
        assert written.created and written.memory.content == "The user's name is Dana."
        assert written.memory.valid_from_time == proposal.valid_from_time
        await wait_for(lambda: outbox_drained(component))
        (duplicate,) = (
            await client.propose_memories(cid, from_sequence=1, through_sequence=1)
        ).proposals
        assert duplicate.action == pb.PROPOSAL_ACTION_DUPLICATE
        with pytest.raises(ValueError):
            await client.confirm_proposal(duplicate)


def test_a_person_picks_proposals_by_number() -> None:
    assert _picked("all", 3) == [0, 1, 2]
    assert _picked("3, 1 1", 3) == [0, 2]
    assert _picked("", 3) == [] and _picked("none", 3) == []
    with pytest.raises(UsageError):
        _picked("4", 3)
