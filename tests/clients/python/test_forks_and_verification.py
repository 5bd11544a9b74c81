"""Forks and verifiable transcripts from the Python client and the `runifold` command,
against a real all-in-one server: fork_conversation, verify_conversation() (and with a
head digest held from before), `runifold transcript fork | verify | export`, an export
verified offline, and tampering made directly in PostgreSQL found by each.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pytest

from runifold_client import AsyncClient, VerificationFailed, assistant, user
from tests.clients.python.test_cli import runifold
from tests.support.stack import Stack


async def _tamper(database_url: str, conversation_id: str) -> None:
    """What an operator with database access could do: change what was said."""
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(
            """UPDATE transcript.entries SET text = 'I never said that'
                WHERE sequence = 2 AND conversation_key = (
                      SELECT conversation_key FROM transcript.conversations
                       WHERE conversation_id = %s)""",
            (uuid.UUID(conversation_id),),
        )


async def test_fork_and_verify_from_the_client(
    stack: Stack, namespace: str, shared_database_url: str
) -> None:
    async with AsyncClient(stack.address, namespace=namespace) as client:
        conversation = await client.create_conversation()
        cid = conversation.conversation_id
        first = await client.append(cid, [user("What is 2 + 2?"), assistant("5")])
        await client.append(cid, [user("Are you sure?")], retract_sequences=[2], expected_version=1)
        # Edit and regenerate: fork before the answer, answer again on the fork.
        fork = await client.fork_conversation(cid, 1, request_id="regenerate-2")
        assert fork.fork_origin.conversation_id == cid
        again = await client.fork_conversation(cid, 1, request_id="regenerate-2")
        assert again.conversation_id == fork.conversation_id
        await client.append(fork.conversation_id, [assistant("4")])
        texts = [e.message.text async for e in client.entries(fork.conversation_id)]
        assert texts == ["What is 2 + 2?", "4"]
        # Its forks, every page of them (one fork a page here), a fork before its own.
        nested = await client.fork_conversation(fork.conversation_id, 2)
        later = await client.fork_conversation(cid, 2)
        forks = await client.list_forks(cid, page_size=1)
        assert [
            (f.conversation_id, f.source_conversation_id, f.through_sequence) for f in forks
        ] == [
            (fork.conversation_id, cid, 1),
            (nested.conversation_id, fork.conversation_id, 2),
            (later.conversation_id, cid, 2),
        ]

        verified = await client.verify_conversation(cid)
        assert verified.appends == 2 and verified.entries == 3
        assert verified.head_digest == (await client.get_conversation(cid)).head_digest
        # The digest an append returned, held since: what it covered is unchanged.
        held = await client.verify_conversation(cid, head_digest=first.digest)
        assert held.appends == 2
        fork_verified = await client.verify_conversation(fork.conversation_id)
        assert fork_verified.appends == 2  # the source's first append and the fork's own

        await _tamper(shared_database_url, cid)
        with pytest.raises(VerificationFailed) as failed:
            await client.verify_conversation(cid)
        assert failed.value.version == 1


async def test_fork_verify_and_export_from_the_command_line(
    stack: Stack, namespace: str, shared_database_url: str, tmp_path: Path
) -> None:
    async with AsyncClient(stack.address, namespace=namespace) as client:
        conversation = await client.create_conversation()
        cid = conversation.conversation_id
        await client.append(cid, [user("one"), assistant("two"), user("three")])
        await client.append(cid, [assistant("four")])
    code, out, err = await runifold(
        stack, "transcript", "fork", cid, "--through", "2", "-n", namespace, "--json"
    )
    assert code == 0, err
    fork = json.loads(out)
    assert fork["fork_origin"] == {"conversation_id": cid, "through_sequence": 2}
    assert fork["last_sequence"] == 2

    code, out, err = await runifold(stack, "transcript", "verify", cid, "-n", namespace, "--json")
    assert code == 0, err
    assert json.loads(out)["verified"] is True

    exported = tmp_path / "conversation.jsonl"
    code, _, err = await runifold(
        stack, "transcript", "export", cid, "--output", str(exported), "-n", namespace
    )
    assert code == 0, err
    kinds = [next(iter(json.loads(line))) for line in exported.read_text().splitlines()]
    assert kinds == ["conversation", "append", "append", "entry", "entry", "entry", "entry"]
    # Offline: no server.
    code, out, err = await runifold(None, "transcript", "verify", "--file", str(exported), "--json")
    assert code == 0, err
    assert json.loads(out) == {
        "verified": True,
        "head_digest": json.loads(out)["head_digest"],
        "appends": 2,
        "entries": 4,
    }
    # An export edited afterwards fails offline...
    edited = tmp_path / "edited.jsonl"
    edited.write_text(exported.read_text().replace('"text": "three"', '"text": "THREE"'))
    code, out, _ = await runifold(None, "transcript", "verify", "--file", str(edited), "--json")
    assert code == 1 and json.loads(out) == {
        "verified": False,
        "version": 1,
        "why": "its entries, retractions or commit time changed",
    }
    # ...and so does the conversation, once changed in the database.
    await _tamper(shared_database_url, cid)
    code, out, _ = await runifold(stack, "transcript", "verify", cid, "-n", namespace)
    assert code == 1 and "NOT VERIFIED" in out and "version 1" in out
